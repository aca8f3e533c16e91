"""Specs: what users write — the job spec (``job``), the sites catalog (``sites``), site credentials held in
memory (``secrets``) — and the YAML loader that validates them with every problem located (``config_file``).
"""
