"""The sharded trainer of one rank: FSDP2 model building, forward passes, actor and critic updates."""
