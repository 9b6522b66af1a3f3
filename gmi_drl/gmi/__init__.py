"""GPU multiplexing instances (GMI-DRL §3-§5): devices, backends, layouts, the local launcher."""
