"""nuScenes tables -> scan tasks, multi-sweep aggregation and lidarseg checks."""
