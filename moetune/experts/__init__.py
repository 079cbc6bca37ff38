"""Where expert weights live: stacked per layer, asked for by the MoE layer."""
