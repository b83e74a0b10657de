"""Where games run: the fleet of rollout workers over HTTP servers and Ray actors."""
