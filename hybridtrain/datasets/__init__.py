"""Datasets: versioned data and what may leave a site — DVC repos (``dvc_repo``), preprocessing
(``preprocess``, ``partitioned``, ``label``), anonymization and the leak scan (``anonymizer``, ``leak_scan``),
the one place bytes cross a site (``transfer``) and the sample data (``sample_data``).
"""
