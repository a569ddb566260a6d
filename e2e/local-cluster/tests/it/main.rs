//! The local cluster's own tests in one binary: its API server against kube-rs and the real
//! kubectl, its kubelet running pods, the whole cluster and its `local-cluster` binary.

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod apiserver_admission;
mod apiserver_autoscaling;
mod apiserver_bad_input;
mod apiserver_kube;
mod apiserver_kubectl;
mod apiserver_pod_security;
mod apiserver_portforward;
mod apiserver_semantics;
mod apiserver_sidecars;
mod apiserver_strict;
mod apiserver_watch;
mod kubelet_hooks;
mod kubelet_pods;
mod kubelet_probes;
mod kubelet_sidecars;
mod local_cluster_bin;
mod local_cluster_bin_pods;
mod local_cluster_pods;
mod local_cluster_sidecars;
