//! kube-harness
