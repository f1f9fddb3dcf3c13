"""Reaching other machines (kernel side): Ray placement of the ranks and their agents
(``placement``), the token-guarded channels the ranks connect back on (``channel_server``), the
relay on the head node for Ray Client addresses (``channel_relay``), a throwaway loopback cluster
(``local_cluster``), and the join of kernels started one per node without Ray (``node_join``).

The backend that uses them is ``launch/backends/cluster.py``; nothing here is imported until a
launch names more than one node, so ``ray`` stays unimported otherwise.
"""
