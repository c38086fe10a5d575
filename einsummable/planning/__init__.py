"""What a plan is made of and what it costs: every decomposition of an op (spec), candidates
placed on a topology's levels (placement, candidates), exchange programs between layouts
(exchange, routes, timing) and their lower bounds (bound), the cost model (cost), and the
Plan with the options it was solved under (plan)."""
