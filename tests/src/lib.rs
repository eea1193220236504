//! Test support for nodeipam: the sandbox Kubernetes API server used by the end-to-end tests.

pub mod sandbox;
