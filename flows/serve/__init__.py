"""`preheat serve`: the coordinator's services, the deployments with their schedules, triggers."""
