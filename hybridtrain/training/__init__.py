"""Training: the model (``model``), its input features (``featurizer``), the trainer with checkpoints and
resume (``trainer``, ``checkpoint``, ``checkpoint_interval``), preemption notices (``preemption``), torchrun
ranks (``distributed``), metrics (``evaluation``) and recovery decisions for one run (``recovery``).
"""
