//! A Kubernetes stand-in on one machine, since no real kube-apiserver can be installed here:
//! the API server (`apiserver`), a small kubelet that runs pods as local processes
//! (`kubelet`), the Deployment controller (`deployments`), and all three together
//! (`cluster`). It knows no product: callers map their images to binaries (`ImageMap::pin`).
//! What it reproduces, and what it does not, is in this crate's README.

pub mod apiserver;
pub mod cluster;
pub mod deployments;
pub mod kubelet;
pub mod pki;
pub mod tasks;
