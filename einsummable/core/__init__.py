"""The bottom of the pipeline: box geometry and the instruction set, which every stage may use
and which import nothing of the other stages."""
