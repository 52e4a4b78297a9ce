"""The synthetic nuScenes-style dataroot: scenes, a ray-cast LiDAR and the tables."""
