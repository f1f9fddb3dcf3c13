"""Healing a pool in place, the worker's side: replicas of the state and the rejoin of a replaced rank."""
