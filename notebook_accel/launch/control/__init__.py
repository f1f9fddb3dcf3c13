"""The user's hands on a running launch: deferred interrupts, the stop button's agreement on a cut, the prompt that debugs one rank."""
