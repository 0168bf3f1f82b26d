"""shadowsync: TorchRec DLRM training with background synchronization of dense replicas."""
