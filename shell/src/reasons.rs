//! Event reasons (`events.k8s.io/v1` `reason`, PascalCase) and actions. Upstream's range allocator
//! uses `CIDRNotAvailable` and `CIDRAssignmentFailed`; the others are ours, for Nodes that
//! upstream would crash-loop on.

/// No free pod CIDR in a cluster CIDR (upstream's reason for an allocation failure).
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
/// Writing `spec.podCIDR(s)` to the Node failed (upstream's reason).
pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
/// The Node's podCIDRs are malformed: unparsable, more than two, the same family twice, or
/// `podCIDR` differs from `podCIDRs[0]`. The Node is skipped.
pub const POD_CIDR_INVALID: &str = "PodCIDRInvalid";
/// The Node's podCIDRs lie outside every cluster CIDR, or are of a family the configuration does
/// not have. The Node is skipped; whatever part overlaps a cluster CIDR stays reserved.
pub const POD_CIDR_OUT_OF_RANGE: &str = "PodCIDROutOfRange";
/// The Node's podCIDRs overlap another Node's. The Node is skipped; its range stays reserved.
pub const POD_CIDR_CONFLICT: &str = "PodCIDRConflict";

/// The Node has no podCIDRs and its `nodeipam.io/node-cidr-mask-size-ipv4`/`-ipv6` label (honoured
/// with `--allow-node-mask-label`) is not a size it may ask for: nothing is allocated until the
/// label is fixed or removed.
pub const NODE_CIDR_MASK_LABEL_INVALID: &str = "NodeCIDRMaskLabelInvalid";

/// A `nodeipam.io` ClusterCIDR cannot be used as a pool (its spec breaks a rule the CRD should
/// have refused — an older or edited CRD — or it overlaps what the allocator cannot share); the
/// event is on the ClusterCIDR, its `Invalid` condition says the same. Ours, in upstream's style
/// (KEP-2593's allocator had no such event: its API server refused these objects).
pub const CLUSTER_CIDR_INVALID: &str = "ClusterCIDRInvalid";

/// Action: allocating a pod CIDR for the Node.
pub const ACTION_ALLOCATE: &str = "AllocatePodCIDR";
/// Action: recording (occupying) the Node's existing pod CIDRs.
pub const ACTION_OCCUPY: &str = "OccupyPodCIDR";
/// Action: turning a ClusterCIDR into a pool (or not).
pub const ACTION_SYNC_CLUSTER_CIDR: &str = "SyncClusterCIDR";
/// Action: writing `spec.podCIDR(s)`.
pub const ACTION_PATCH: &str = "PatchNode";

/// Diagnostic (R08): the Node's podCIDR is not written canonically (host bits set, e.g.
/// `10.1.2.2/24`); the controller uses its network (`10.1.2.0/24`), a CNI may not.
pub const POD_CIDR_NOT_CANONICAL: &str = "PodCIDRNotCanonical";
/// Diagnostic (R10): the Node's podCIDRs are in the other family order than `--cluster-cidr`;
/// kept (matched by family), while kube-controller-manager would refuse them.
pub const POD_CIDR_FAMILY_ORDER: &str = "PodCIDRFamilyOrder";
/// Diagnostic (R11): a dual-stack cluster, and the Node has podCIDRs of one family only; it can
/// never get the other one (podCIDRs are immutable once set).
pub const POD_CIDR_MISSING_FAMILY: &str = "PodCIDRMissingFamily";
