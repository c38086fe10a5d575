"""The one MIP: the model of a (graph, topology, options) (model, memory, ties, memo), its
objective (objective), lazy pricing of edge cells (pricing), the search and its LP phase
(search, lp_phase, policy), named strategies (named), the entry points and the plan cache
(api, cache), and the report (report)."""
