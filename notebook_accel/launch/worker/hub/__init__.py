"""A node's hub on a cluster: the node link's framing, its pump, the hub actor and the fork of the node's ranks."""
