"""Workloads: length distributions (:mod:`.lengths`), arrival processes (:mod:`.arrivals`),
traces (:mod:`.trace`), presets (:mod:`.presets`), SLOs (:mod:`.slo`) and the PD planner's
discretized lengths (:mod:`.pd_lengths`)."""
