"""Several processes: launching ranks (launch), the data-parallel RL step (data_parallel), FSDP sharding (fsdp)."""
