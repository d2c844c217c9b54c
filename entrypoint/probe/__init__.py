"""The node's facts, probed once and never decided on here: address and interface, GPUs/HPUs, EFA
devices and instance facts, installed versions and programs; the EFA preflight's checks."""
