//! ClusterCIDR objects written and read as an external actor (an operator's `kubectl`) would:
//! straight into the store, with the CRD's validation and strategies, no faults.

use serde_json::Value;

use super::{ApiError, Resource, SandboxHandle};

impl SandboxHandle {
    /// Create a ClusterCIDR (ADDED event).
    ///
    /// # Errors
    /// As the API: 409 AlreadyExists, 422 Invalid.
    pub fn create_cluster_cidr(&self, object: Value) -> Result<Value, ApiError> {
        self.create_as_actor(Resource::ClusterCidrs, object)
    }

    /// Delete a ClusterCIDR (marked with a `deletionTimestamp` while it has finalizers).
    ///
    /// # Errors
    /// 404 NotFound.
    pub fn delete_cluster_cidr(&self, name: &str) -> Result<Value, ApiError> {
        self.delete_as_actor(Resource::ClusterCidrs, name)
    }

    /// From now on, ClusterCIDR updates are checked only as any object's metadata is: as a
    /// hostile operator's CRD without our OpenAPI checks and CEL rules (`self == oldSelf` on
    /// `spec`, the CIDR and host-bit rules) would accept them, so a `spec` can be edited in place.
    pub fn drop_cluster_cidr_rules(&self) {
        self.store().cluster_cidr_rules = false;
    }

    /// Every ClusterCIDR.
    pub fn cluster_cidrs(&self) -> Vec<Value> {
        self.store().objects(Resource::ClusterCidrs, None)
    }
}
