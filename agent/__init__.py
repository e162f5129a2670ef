"""Sources, attribution, the sampler and the agent process (imported as `gpuscope.agent`)."""
