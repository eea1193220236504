//! The resource types the sandbox serves and how their URLs look.

/// A resource type served by the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `v1` `Node` (cluster-scoped), `/api/v1/nodes`.
    Nodes,
    /// `coordination.k8s.io/v1` `Lease` (namespaced).
    Leases,
    /// `events.k8s.io/v1` `Event` (namespaced).
    Events,
    /// `v1` `Event` (namespaced), the legacy core events.
    CoreEvents,
    /// `nodeipam.io/v1alpha1` `ClusterCIDR` (cluster-scoped, with a `status` subresource): the
    /// custom resource of `deploy/crds/clustercidrs.yaml`, served as kube-apiserver serves a CRD
    /// ([`super::cluster_cidrs`]).
    ClusterCidrs,
}

impl Resource {
    /// All served resources.
    pub const ALL: [Resource; 5] = [
        Resource::Nodes,
        Resource::Leases,
        Resource::Events,
        Resource::CoreEvents,
        Resource::ClusterCidrs,
    ];

    /// API group (`""` for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Nodes | Resource::CoreEvents => "",
            Resource::Leases => "coordination.k8s.io",
            Resource::Events => "events.k8s.io",
            Resource::ClusterCidrs => "nodeipam.io",
        }
    }

    /// The served version of the group (`v1`, or `v1alpha1` for ClusterCIDRs).
    pub fn version(self) -> &'static str {
        match self {
            Resource::ClusterCidrs => "v1alpha1",
            _ => "v1",
        }
    }

    /// `apiVersion` of objects of this type.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Nodes | Resource::CoreEvents => "v1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::Events => "events.k8s.io/v1",
            Resource::ClusterCidrs => "nodeipam.io/v1alpha1",
        }
    }

    /// Whether the resource is a custom resource (served by apiextensions-apiserver: no
    /// strategic merge patch, `metadata.generation` kept, unknown fields pruned).
    pub fn is_custom(self) -> bool {
        matches!(self, Resource::ClusterCidrs)
    }

    /// Whether `/NAME/status` is served (Nodes, and CRDs declaring `subresources.status`).
    pub fn has_status_subresource(self) -> bool {
        matches!(self, Resource::Nodes | Resource::ClusterCidrs)
    }

    /// `kind` of objects of this type.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Nodes => "Node",
            Resource::Leases => "Lease",
            Resource::Events | Resource::CoreEvents => "Event",
            Resource::ClusterCidrs => "ClusterCIDR",
        }
    }

    /// `kind` of list responses.
    pub fn list_kind(self) -> &'static str {
        match self {
            Resource::Nodes => "NodeList",
            Resource::Leases => "LeaseList",
            Resource::Events | Resource::CoreEvents => "EventList",
            Resource::ClusterCidrs => "ClusterCIDRList",
        }
    }

    /// URL plural, e.g. `nodes`.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Nodes => "nodes",
            Resource::Leases => "leases",
            Resource::Events | Resource::CoreEvents => "events",
            Resource::ClusterCidrs => "clustercidrs",
        }
    }

    /// Plural qualified with the group, as messages show it: `leases.coordination.k8s.io`.
    pub fn qualified_plural(self) -> String {
        if self.group().is_empty() {
            self.plural().to_owned()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// The etcd key kube-apiserver stores an object under (as error messages show it):
    /// `/registry/minions/NAME` for Nodes (the special prefix of
    /// `pkg/kubeapiserver/default_storage_factory_builder.go`), `/registry/leases/NS/NAME`,
    /// `/registry/events/NS/NAME` (both Event APIs share the `events` prefix), and
    /// `/registry/GROUP/PLURAL/NAME` for a cluster-scoped custom resource.
    pub fn etcd_key(self, ns: &str, name: &str) -> String {
        match self {
            Resource::Nodes => format!("/registry/minions/{name}"),
            Resource::Leases => format!("/registry/leases/{ns}/{name}"),
            Resource::Events | Resource::CoreEvents => format!("/registry/events/{ns}/{name}"),
            Resource::ClusterCidrs => format!("/registry/nodeipam.io/clustercidrs/{name}"),
        }
    }

    /// `AllowUnconditionalUpdate` of the resource's strategy: whether an update without
    /// `metadata.resourceVersion` is allowed (Nodes: `pkg/registry/core/node/strategy.go`, Events:
    /// `pkg/registry/core/event/strategy.go` — yes; Leases:
    /// `pkg/registry/coordination/lease/strategy.go`, custom resources:
    /// `apiextensions-apiserver/pkg/registry/customresource/strategy.go` — no).
    pub fn allow_unconditional_update(self) -> bool {
        !matches!(self, Resource::Leases | Resource::ClusterCidrs)
    }

    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Resource::Nodes | Resource::ClusterCidrs)
    }

    /// URL prefix of the group/version: `/api/v1` or `/apis/GROUP/VERSION`.
    pub fn prefix(self) -> String {
        if self.group().is_empty() {
            "/api/v1".to_owned()
        } else {
            format!("/apis/{}/{}", self.group(), self.version())
        }
    }

    /// Find a resource from its group, version and plural.
    pub fn from_group_plural(group: &str, version: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.version() == version && r.plural() == plural)
    }
}

/// The Kubernetes verb of a request (as in RBAC / audit logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (any content type, also one refused with 415, e.g. server-side apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// Lower-case verb name as RBAC spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// A parsed request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The resource.
    pub resource: Resource,
    /// Namespace from the path (`None` = cluster-scoped or all namespaces).
    pub namespace: Option<String>,
    /// Object name (`None` = collection).
    pub name: Option<String>,
    /// Subresource, e.g. `status`.
    pub subresource: Option<String>,
}

/// Parse `/api/v1/...` and `/apis/GROUP/VERSION/...` paths.
pub fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some((*name).to_owned()), None),
        [plural, name, sub] => (*plural, Some((*name).to_owned()), Some((*sub).to_owned())),
        _ => return None,
    };
    let resource = Resource::from_group_plural(group, version, plural)?;
    if !resource.namespaced() && namespace.is_some() {
        return None;
    }
    if resource.namespaced() && namespace.is_none() && name.is_some() {
        return None;
    }
    if let Some(s) = &sub
        && !(resource.has_status_subresource() && s == "status")
    {
        return None;
    }
    Some(Target {
        resource,
        namespace,
        name,
        subresource: sub,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths() {
        let t = parse_path("/api/v1/nodes/n1").expect("node path");
        assert_eq!(
            (t.resource, t.name.as_deref()),
            (Resource::Nodes, Some("n1"))
        );
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
            .expect("leases");
        assert_eq!(
            (t.resource, t.namespace.as_deref(), t.name),
            (Resource::Leases, Some("kube-system"), None)
        );
        let t = parse_path("/api/v1/nodes/n1/status").expect("status");
        assert_eq!(t.subresource.as_deref(), Some("status"));
        assert!(parse_path("/api/v1/namespaces/x/nodes").is_none());
        assert!(parse_path("/api/v1/pods").is_none());
        assert!(parse_path("/apis/events.k8s.io/v1/events").is_some());
        assert!(parse_path("/apis/events.k8s.io/v1/events/x").is_none());
        let t = parse_path("/apis/nodeipam.io/v1alpha1/clustercidrs/pool-a/status")
            .expect("a ClusterCIDR's status");
        assert_eq!(
            (t.resource, t.name.as_deref(), t.subresource.as_deref()),
            (Resource::ClusterCidrs, Some("pool-a"), Some("status"))
        );
        assert!(parse_path("/apis/nodeipam.io/v1/clustercidrs").is_none());
        assert!(parse_path("/apis/nodeipam.io/v1alpha1/namespaces/x/clustercidrs").is_none());
        assert!(parse_path("/apis/coordination.k8s.io/v1alpha1/leases").is_none());
    }
}
