"""Training: the model (``model``), its input features (``featurizer``), the trainer with checkpoints and
resume (``trainer``, ``checkpoint``, ``checkpoint_interval``), preemption notices (``preemption``), torchrun
ranks (``distributed``), metrics (``evaluation``), recovery decisions for one run (``recovery``), and the
formats a trained model ships in: an MLflow pyfunc that takes records (``record_model``) and an export a
small device runs without our stack (``edge_export``).
"""
