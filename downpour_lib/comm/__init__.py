"""Every torch.distributed call lives here: the runtime, metered collectives, the DDP wrapper."""
