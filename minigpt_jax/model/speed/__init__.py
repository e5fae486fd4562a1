"""The speed room: faster paths of the reference core's math (hand-written VJPs, bfloat16
operands, fused attention kernels) and the per-backend "auto" choice among them (`backend`)."""
