"""The request and its plan: options from every door, checks before any worker starts, the start method and the rendezvous."""
