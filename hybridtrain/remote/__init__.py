"""Remote: running on hosts the control plane does not run on — SSH sites (``ssh_site``), the job bundle a
host receives (``job_bundle``), the host side of a job (``host_training``), training over SSH
(``remote_training``) and site health (``site_health``).
"""
