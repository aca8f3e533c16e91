"""Drill: failover drills — faults injected into a real training run, and how long and how much it took to recover.

``runner`` runs a drill (``run_drill``) and records it; ``scenarios`` holds the faults by name;
``environment`` the drill's small job, data, sites and training processes; ``timeline`` the timing of
each scenario; ``report`` what was measured; ``loopback`` throwaway S3 and SSH servers on 127.0.0.1
(used by drills and tests alike); ``processes`` finding and stopping process trees; ``worker`` the
host job a drill's training process runs.
"""
