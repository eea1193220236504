#!/usr/bin/env bash
# A one-node (or N-node) Kubernetes cluster on this machine, with the controller running as a Pod
# (issue 33):
#
#   sudo tests/cluster/cluster.sh up      # prints the KUBECONFIG to use
#   sudo tests/cluster/cluster.sh up --nodes 2   # two real Nodes, the chart's two replicas
#   sudo tests/cluster/cluster.sh down    # always safe to run; leaves nothing behind
#
# What runs (all on a bridge this script creates, `nodeipam0`, 10.99.0.1/24, never a real
# network; one cluster per machine):
#
#   etcd, kube-apiserver, kube-controller-manager (its own range allocator off:
#   --allocate-node-cidrs=false), kube-scheduler, the kubelet   tests/upstream/build.sh's binaries
#                                                               (the pinned k8s.io/kubernetes)
#   containerd 1.6, runc, the CNI bridge + host-local plugins   Debian's packages (apt-get, here)
#   the Pod network                                             containerd's CNI conf_template:
#                                                               the bridge `nodeipam-cni0` and
#                                                               host-local over the Node's
#                                                               {{.PodCIDR}}, which our controller
#                                                               writes (no CIDR until it runs)
#   images                                                      OCI archives built here and loaded
#                                                               with `ctr images import`: the pause
#                                                               program (build.sh's cmd/pause),
#                                                               busybox-static, and the controller
#                                                               (the release binary in the final
#                                                               image's contents)
#   the controller                                              the Helm chart (charts/nodeipam)
#                                                               with the pinned helm: one replica
#                                                               on one Node, the chart's two on
#                                                               two or more
#
# With `up --nodes N`, Nodes 1…N-1 (nodeipam-node-1 at 10.99.0.2, …) are real kubelets too, each
# in its own network namespace (named as its Node) on a veth in the bridge (`nodeipam-hI`), with
# its own containerd (root, state, socket), kubelet --root-dir, cgroup root
# (/nodeipam-node-I/kubepods in each hierarchy), Pod log folder and CNI bridge (inside its
# namespace), so that the chart's two replicas (anti-affinity, the secure port a host port) run
# on two Nodes. A namespace's only route off the bridge is the service range (to the DNAT rule).
# What the kubelets still share: /var/lib/kubelet/device-plugins (a hard-coded path; each kubelet
# replaces the other's registration socket, unused here: no device plugins), the sysctls below.
#
# kube-apiserver keeps an audit log (logs/audit.log) of every write of a Node object (not its
# status), with the request body: who PATCHed which podCIDR, how often.
#
# In-cluster access to the `kubernetes` Service (10.96.0.1:443) is one DNAT rule in our own
# iptables chain (no kube-proxy). Host changes (iptables chains, mounts, cgroups, sysctls the
# kubelet and the CNI set, /var/lib/kubelet, /var/log/pods, network namespaces, links) are
# recorded at `up` and undone by `down`, which ends by checking that nothing is left
# (exit 1 naming what is).
#
# Commands:
#   up [--nodes N] [--no-controller]
#                          start the cluster with N real Nodes (default 1, at most 8;
#                          --no-controller: the Nodes are left without a podCIDR, for installing
#                          the controller yourself)
#   down                   stop everything and undo every host change; with
#                          NODEIPAM_CLUSTER_KEEP_LOGS=DIR the logs are copied to DIR first
#   status                 the processes and `kubectl get nodes,pods -A`
#   deps                   only install the packages and build (or reuse) build.sh's binaries
#   kcm FLAG...            restart kube-controller-manager with FLAGs after its usual ones
#                          (e.g. --allocate-node-cidrs=true --cluster-cidr=10.244.0.0/16)
#   hollow add NAME...     start a kubemark hollow Node per NAME (real kubelet code, fake
#                          runtime; about 19 MB each); `hollow delete NAME...` stops them
#   env                    the `export KUBECONFIG=…` line
#
# Environment:
#   NODEIPAM_CLUSTER_DIR     state folder (default /var/tmp/nodeipam-cluster): PKI, kubeconfigs,
#                            logs, etcd, containerd's and the kubelet's roots
#   NODEIPAM_UPSTREAM_BIN    build.sh's folder (default: run tests/upstream/build.sh)
#   NODEIPAM_CLUSTER_KCM_ARGS  extra kube-controller-manager flags (space-separated), e.g.
#                            "--allocate-node-cidrs=true --cluster-cidr=10.244.0.0/16"
#   NODEIPAM_CONTROLLER_BIN  the controller binary for the image (default: target/release/…,
#                            built with the Dockerfile's `cargo build` line when missing)
#
# Needs root (Linux, Debian's apt for the packages), Go and the module proxy for a cold build.sh.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${NODEIPAM_CLUSTER_DIR:-/var/tmp/nodeipam-cluster}"
LOCK=/run/nodeipam-cluster.lock

NODE_NAME=nodeipam-node-0
NODE_IP=10.99.0.1
MAX_NODES=8
NODE_NET=10.99.0.1/24
HOST_BRIDGE=nodeipam0
POD_BRIDGE=nodeipam-cni0
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SERVICE_IP=10.96.0.1
APISERVER_PORT=6443
NAT_CHAIN=NODEIPAM-CLUSTER
# Host settings the kubelet (protectKernelDefaults: false) or the CNI bridge plugin may change.
SYSCTLS=(net/ipv4/ip_forward vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# Paths that the kubelet or the runtime create outside the state folder; removed at `down` only
# if they did not exist at `up`.
OUTSIDE_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns
    /opt/containerd /etc/kubernetes)

PAUSE_IMAGE=localhost/nodeipam/pause:1
BUSYBOX_IMAGE=localhost/nodeipam/busybox:1
CONTROLLER_REPOSITORY=localhost/nodeipam-controller

log() { echo "cluster.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}

# Node I (0…): its name, address, folder (Node 0's is the state folder itself), the name of
# its processes' pid and log files (NAME for Node 0, NAME-node-I for the others) and its network
# namespace (none for Node 0: the host's).
node_name() { echo "nodeipam-node-$1"; }
node_ip() { echo "10.99.0.$(($1 + 1))"; }
node_dir() {
    if (($1 == 0)); then echo "$STATE"; else echo "$STATE/node-$1"; fi
}
node_proc() {
    if (($1 == 0)); then echo "$2"; else echo "$2-node-$1"; fi
}
# in_node I: IN_NODE is the prefix that runs a command in Node I's network namespace (nsenter
# execs it: the same pid; the host's mount namespace, so the kubelet's mounts are containerd's).
in_node() {
    IN_NODE=()
    (($1 == 0)) || IN_NODE=(nsenter --net="/run/netns/$(node_name "$1")")
}
node_count() { cat "$STATE/nodes" 2>/dev/null || echo 1; }

CTR_NODE() {
    local i="$1"
    shift
    ctr --address "$(node_dir "$i")/containerd/containerd.sock" -n k8s.io "$@"
}
CTR() { CTR_NODE 0 "$@"; }
KUBECTL() { kubectl --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# ----- dependencies ------------------------------------------------------------------------------
install_packages() {
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
    [[ -x /bin/busybox ]] && file_is_static /bin/busybox || missing+=(busybox-static)
    command -v iptables >/dev/null || missing+=(iptables)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v jq >/dev/null || missing+=(jq)
    command -v curl >/dev/null || missing+=(curl)
    command -v kubectl >/dev/null || missing+=(kubernetes-client)
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]} (apt-get)"
    timeout 300 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}
file_is_static() { ! ldd "$1" >/dev/null 2>&1; }

upstream_bin() {
    if [[ -z "${NODEIPAM_UPSTREAM_BIN:-}" ]]; then
        NODEIPAM_UPSTREAM_BIN="$("$ROOT/tests/upstream/build.sh" | tail -n 1)"
    fi
    local b
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet helm pause; do
        [[ -x "$NODEIPAM_UPSTREAM_BIN/$b" ]] ||
            die "$NODEIPAM_UPSTREAM_BIN/$b is missing (run tests/upstream/build.sh)"
    done
    BIN="$NODEIPAM_UPSTREAM_BIN"
}

controller_bin() {
    CONTROLLER_BIN="${NODEIPAM_CONTROLLER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/nodeipam-controller}"
    if [[ ! -x "$CONTROLLER_BIN" ]]; then
        local line
        line="$(sed -n 's/^RUN \(cargo build .*\)$/\1/p' "$ROOT/Dockerfile" | head -n 1)"
        log "building the controller: $line"
        (cd "$ROOT" && $line)
    fi
    [[ -x "$CONTROLLER_BIN" ]] || die "$CONTROLLER_BIN is missing"
}

# ----- OCI archives --------------------------------------------------------------------------------
# oci_archive ROOTFS NAME CONFIG_JSON OUT: a one-layer OCI image archive (uncompressed layer,
# reproducible tar) named NAME for containerd's import.
oci_archive() {
    local rootfs="$1" name="$2" config="$3" out="$4" dir layer_digest layer_size cfg_digest cfg_size
    dir="$(mktemp -d "$STATE/images/oci.XXXXXX")"
    mkdir -p "$dir/blobs/sha256"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$dir/layer.tar" .
    layer_digest="$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
    layer_size="$(stat -c %s "$dir/layer.tar")"
    mv "$dir/layer.tar" "$dir/blobs/sha256/$layer_digest"
    jq -c --arg d "sha256:$layer_digest" \
        '{architecture: "amd64", os: "linux", config: ., rootfs: {type: "layers", diff_ids: [$d]}}' \
        <<<"$config" >"$dir/config.json"
    cfg_digest="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
    cfg_size="$(stat -c %s "$dir/config.json")"
    mv "$dir/config.json" "$dir/blobs/sha256/$cfg_digest"
    jq -nc --arg c "sha256:$cfg_digest" --argjson cs "$cfg_size" --arg l "sha256:$layer_digest" \
        --argjson ls "$layer_size" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
          layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l, size: $ls}]}' \
        >"$dir/manifest.json"
    local m_digest m_size
    m_digest="$(sha256sum "$dir/manifest.json" | cut -d' ' -f1)"
    m_size="$(stat -c %s "$dir/manifest.json")"
    mv "$dir/manifest.json" "$dir/blobs/sha256/$m_digest"
    jq -nc --arg m "sha256:$m_digest" --argjson ms "$m_size" --arg n "$name" --arg t "${name##*:}" \
        '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
          digest: $m, size: $ms, platform: {architecture: "amd64", os: "linux"},
          annotations: {"io.containerd.image.name": $n, "org.opencontainers.image.ref.name": $t}}]}' \
        >"$dir/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf "$out" \
        oci-layout index.json blobs
    rm -rf "$dir"
}

# The controller image: what the Dockerfile's final stage (distroless/cc, user 65532) holds for
# the binary, assembled as .ci/run's image step does: the binary, the glibc it links, libgcc_s,
# the CA bundle and /etc/passwd with the nonroot user.
controller_rootfs() {
    local r="$1" lib
    mkdir -p "$r/usr/local/bin" "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot"
    chmod 1777 "$r/tmp"
    chown 65532:65532 "$r/home/nonroot"
    cp "$CONTROLLER_BIN" "$r/usr/local/bin/nodeipam-controller"
    cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
        >"$r/etc/passwd"
    for lib in $(ldd "$CONTROLLER_BIN" 2>/dev/null | grep -o '/[^ ]*' || true); do
        mkdir -p "$r$(dirname "$lib")"
        cp -L "$lib" "$r$lib"
    done
}

build_images() {
    local work version
    mkdir -p "$STATE/images"
    work="$(mktemp -d "$STATE/images/root.XXXXXX")"
    mkdir -p "$work/pause" "$work/busybox/bin" "$work/controller"
    cp "$BIN/pause" "$work/pause/pause"
    oci_archive "$work/pause" "$PAUSE_IMAGE" '{"Entrypoint":["/pause"],"User":"65535:65535"}' \
        "$STATE/images/pause.tar"
    cp /bin/busybox "$work/busybox/bin/busybox"
    ln -s busybox "$work/busybox/bin/sh"
    oci_archive "$work/busybox" "$BUSYBOX_IMAGE" \
        '{"Entrypoint":["/bin/busybox"],"Cmd":["sleep","3600"],"Env":["PATH=/bin"]}' \
        "$STATE/images/busybox.tar"
    controller_rootfs "$work/controller"
    version="$("$CONTROLLER_BIN" --version | awk '{print $2}')"
    CONTROLLER_TAG="$version"
    oci_archive "$work/controller" "$CONTROLLER_REPOSITORY:$version" \
        '{"Entrypoint":["/usr/local/bin/nodeipam-controller"],"User":"65532:65532","Env":["PATH=/usr/local/bin"]}' \
        "$STATE/images/controller.tar"
    rm -rf "$work"
    echo "$CONTROLLER_TAG" >"$STATE/controller-tag"
}

# import_images I: the three images into Node I's containerd.
import_images() {
    local i="$1" a
    for a in pause busybox controller; do
        CTR_NODE "$i" images import --no-unpack=false "$STATE/images/$a.tar" >/dev/null
    done
    CTR_NODE "$i" images ls -q | grep '^localhost/' >&2
}

# ----- host state ----------------------------------------------------------------------------------
record_host() {
    local s p t
    : >"$STATE/host/sysctl"
    for s in "${SYSCTLS[@]}"; do
        [[ -r "/proc/sys/$s" ]] && echo "$s $(cat "/proc/sys/$s")" >>"$STATE/host/sysctl"
    done
    : >"$STATE/host/paths"
    for p in "${OUTSIDE_PATHS[@]}"; do
        [[ -e "$p" ]] && echo "$p" >>"$STATE/host/paths"
    done
    ls /run/netns 2>/dev/null >"$STATE/host/netns" || true
    # `ip netns add` (Nodes 1…) makes /run/netns a mount point of its own.
    : >"$STATE/host/netns-mount"
    mountpoint -q /run/netns 2>/dev/null && echo /run/netns >"$STATE/host/netns-mount"
    # kubemark's hollow kubelets make their root folders in /tmp whatever TMPDIR says.
    ls -d /tmp/hollow-kubelet.* 2>/dev/null >"$STATE/host/hollow-tmp" || true
    for t in filter nat mangle raw; do
        iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" { print $2 }' >"$STATE/host/iptables-$t" || true
        ip6tables -t "$t" -S 2>/dev/null | awk '$1 == "-N" { print $2 }' >"$STATE/host/ip6tables-$t" || true
    done
    ls /sys/fs/cgroup/ >"$STATE/host/cgroup-controllers"
}

setup_network() {
    ip link add "$HOST_BRIDGE" type bridge
    ip addr add "$NODE_NET" dev "$HOST_BRIDGE"
    ip link set "$HOST_BRIDGE" up
    # Service addresses stay on the bridge (never the default route), whatever is rewritten.
    ip route add "$SERVICE_CIDR" dev "$HOST_BRIDGE"
    # The `kubernetes` Service's ClusterIP for host-network Pods (OUTPUT) and Pods on the bridge
    # (PREROUTING): kube-apiserver on the node IP.
    iptables -t nat -N "$NAT_CHAIN"
    iptables -t nat -A "$NAT_CHAIN" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
        -j DNAT --to-destination "$NODE_IP:$APISERVER_PORT"
    iptables -t nat -I OUTPUT -j "$NAT_CHAIN"
    iptables -t nat -I PREROUTING -j "$NAT_CHAIN"
}

# ----- PKI -----------------------------------------------------------------------------------------
# cert NAME SUBJECT [SAN]: a key and a certificate signed by the cluster CA.
cert() {
    local name="$1" subject="$2" san="${3:-}" ext
    ext="$(mktemp)"
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [[ -n "$san" ]]; then
            echo "extendedKeyUsage=serverAuth,clientAuth"
            echo "subjectAltName=$san"
        else
            echo "extendedKeyUsage=clientAuth"
        fi
    } >"$ext"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$STATE/pki/$name.key" 2>/dev/null
    openssl req -new -key "$STATE/pki/$name.key" -subj "$subject" -out "$STATE/pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$STATE/pki/$name.csr" -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" \
        -CAcreateserial -days 2 -extfile "$ext" -out "$STATE/pki/$name.crt" 2>/dev/null
    rm -f "$ext" "$STATE/pki/$name.csr"
}

kubeconfig() {
    local name="$1" user="$2"
    cat >"$STATE/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: nodeipam
    cluster:
      server: https://$NODE_IP:$APISERVER_PORT
      certificate-authority: $STATE/pki/ca.crt
users:
  - name: $user
    user:
      client-certificate: $STATE/pki/$name.crt
      client-key: $STATE/pki/$name.key
contexts:
  - name: nodeipam
    context:
      cluster: nodeipam
      user: $user
current-context: nodeipam
EOF
}

make_pki() {
    mkdir -p "$STATE/pki"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$STATE/pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$STATE/pki/ca.key" -subj "/CN=nodeipam-cluster-ca" -days 2 \
        -out "$STATE/pki/ca.crt" 2>/dev/null
    cert apiserver "/CN=kube-apiserver" \
        "IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
    cert admin "/O=system:masters/CN=nodeipam-cluster-admin"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    cert controller-manager "/CN=system:kube-controller-manager"
    cert scheduler "/CN=system:kube-scheduler"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$STATE/pki/sa.key" 2>/dev/null
    openssl pkey -in "$STATE/pki/sa.key" -pubout -out "$STATE/pki/sa.pub" 2>/dev/null
    kubeconfig admin nodeipam-cluster-admin
    kubeconfig controller-manager system:kube-controller-manager
    kubeconfig scheduler system:kube-scheduler
    kubeconfig kubelet "system:node:$NODE_NAME"
}

# ----- processes -----------------------------------------------------------------------------------
# start NAME COMMAND...: in its own session, output to logs/NAME.log, pid in pids/NAME.
start() {
    local name="$1"
    shift
    setsid "$@" </dev/null >>"$STATE/logs/$name.log" 2>&1 9>&- &
    echo $! >"$STATE/pids/$name"
}

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds; a process of ours that exits meanwhile
# fails the wait with its log.
wait_for() {
    local what="$1" seconds="$2" i p
    shift 2
    for ((i = 0; i < seconds * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        for p in "$STATE"/pids/*; do
            if ! kill -0 "$(cat "$p")" 2>/dev/null; then
                log "$(basename "$p") exited while waiting for $what; the end of its log:"
                tail -n 30 "$STATE/logs/$(basename "$p").log" >&2
                return 1
            fi
        done
        sleep 0.2
    done
    log "timed out after ${seconds}s waiting for $what"
    return 1
}

apiserver_ready() {
    [[ "$(curl -s --max-time 2 --cacert "$STATE/pki/ca.crt" --cert "$STATE/pki/admin.crt" \
        --key "$STATE/pki/admin.key" "https://$NODE_IP:$APISERVER_PORT/readyz")" == ok ]]
}

# start_kcm [FLAG...]: kube-controller-manager with every controller, ServiceAccount credentials
# per controller and its range allocator off; FLAGs come last (the last value of a flag wins).
start_kcm() {
    start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --use-service-account-credentials=true --controllers='*' --allocate-node-cidrs=false \
        --service-account-private-key-file="$STATE/pki/sa.key" --root-ca-file="$STATE/pki/ca.crt" \
        --cluster-signing-cert-file="$STATE/pki/ca.crt" --cluster-signing-key-file="$STATE/pki/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --leader-elect=false --secure-port=0 "$@"
}

start_control_plane() {
    local kcm_extra=()
    # The audit log (logs/audit.log) records every write of a Node object itself (not its status)
    # with its body: who PATCHed which Node's podCIDR, and how often (the tests count them).
    cat >"$STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update, patch, delete]
    resources: [{group: "", resources: [nodes]}]
  - level: None
EOF
    read -r -a kcm_extra <<<"${NODEIPAM_CLUSTER_KCM_ARGS:-}"
    start etcd "$BIN/etcd" --name=nodeipam --data-dir="$STATE/etcd" \
        --listen-client-urls="http://$NODE_IP:2379" --advertise-client-urls="http://$NODE_IP:2379" \
        --listen-peer-urls="http://$NODE_IP:2380" --initial-advertise-peer-urls="http://$NODE_IP:2380" \
        --initial-cluster="nodeipam=http://$NODE_IP:2380" --unsafe-no-fsync=true
    start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://$NODE_IP:2379" \
        --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
        --tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key" \
        --client-ca-file="$STATE/pki/ca.crt" --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --kubelet-client-certificate="$STATE/pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$STATE/pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$STATE/pki/ca.crt" \
        --kubelet-preferred-address-types=InternalIP \
        --service-account-key-file="$STATE/pki/sa.pub" \
        --service-account-signing-key-file="$STATE/pki/sa.key" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range="$SERVICE_CIDR" --cert-dir="$STATE/pki/apiserver-cert-dir" \
        --audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$STATE/logs/audit.log"
    wait_for kube-apiserver 120 apiserver_ready
    # Its own range allocator off (unless NODEIPAM_CLUSTER_KCM_ARGS turns it on): the Node gets no
    # podCIDR until our controller runs.
    start_kcm "${kcm_extra[@]}"
    start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
        --leader-elect=false --secure-port=0
}

# start_containerd I: Node I's containerd, in its network namespace (the sandboxes' and the
# host-network Pods' network is the one containerd runs in).
start_containerd() {
    local i="$1" dir
    dir="$(node_dir "$i")"
    mkdir -p "$dir/containerd" "$dir/cni/net.d"
    # The Pod network of the Node's podCIDR: containerd renders this template once the kubelet
    # passes the podCIDR (CRI UpdateRuntimeConfig); until then the Node is NotReady (no CNI
    # config). No masquerading and no port mapping: Pods reach only the node's bridges. The
    # bridge is created in containerd's network namespace (one per Node); host-local keeps its
    # reservations in the Node's folder.
    cat >"$dir/cni/template.json" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nodeipam",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
    cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # runc fails every sandbox here ("can't get final child's PID from pipe: EOF") without it.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
    conf_template = "$dir/cni/template.json"
EOF
    in_node "$i"
    start "$(node_proc "$i" containerd)" "${IN_NODE[@]}" containerd --config "$dir/containerd/config.toml"
    wait_for "containerd of $(node_name "$i")" 30 CTR_NODE "$i" version
}

# start_kubelet I: Node I's kubelet (Node 0's certificates are make_pki's).
start_kubelet() {
    local i="$1" dir name ip pki extra=""
    dir="$(node_dir "$i")"
    name="$(node_name "$i")"
    ip="$(node_ip "$i")"
    pki="$(node_proc "$i" kubelet)"
    if ((i > 0)); then
        cert "$pki-serving" "/CN=$name" "IP:$ip,DNS:$name"
        cert "$pki" "/O=system:nodes/CN=system:node:$name"
        kubeconfig "$pki" "system:node:$name"
        # Its own cgroup root and Pod log folder: a kubelet removes Pod cgroups and log folders
        # of Pods it does not know (the other kubelet's).
        extra="cgroupRoot: /$name
podLogsDir: $dir/pod-logs"
    else
        pki=kubelet
    fi
    mkdir -p "$dir/kubelet"
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind is cgroup v1.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $STATE/pki/$pki-serving.crt
tlsPrivateKeyFile: $STATE/pki/$pki-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $STATE/pki/ca.crt
authorization:
  mode: Webhook
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
$extra
EOF
    in_node "$i"
    start "$(node_proc "$i" kubelet)" "${IN_NODE[@]}" "$BIN/kubelet" --config="$dir/kubelet.yaml" \
        --kubeconfig="$STATE/$pki.kubeconfig" --root-dir="$dir/kubelet" \
        --hostname-override="$name" --node-ip="$ip" -v=1
}

# register_node I: waits for Node I's registration and labels it.
register_node() {
    local name
    name="$(node_name "$1")"
    wait_for "Node $name" 60 KUBECTL get node "$name"
    # The chart and deploy/ place the controller on control-plane Nodes (the kubelet may not
    # set node-role labels itself).
    KUBECTL label node "$name" node-role.kubernetes.io/control-plane= >/dev/null
}

# Node I's cgroup root, /nodeipam-node-I in every cgroup v1 hierarchy (the kubelet checks that
# it exists; cpuset's needs its CPUs and memory nodes before tasks can join below it).
node_cgroup_root() {
    local name="$1" h
    for h in /sys/fs/cgroup/*/; do
        [[ "$h" == /sys/fs/cgroup/unified/ || -L "${h%/}" ]] && continue
        mkdir -p "$h$name"
        if [[ -f "${h}cpuset.cpus" ]]; then
            cat "${h}cpuset.cpus" >"$h$name/cpuset.cpus"
            cat "${h}cpuset.mems" >"$h$name/cpuset.mems"
        fi
    done
}

# add_node I (I > 0): Node I's network namespace, on a veth in the host bridge; its cgroup root;
# its containerd with the images (its kubelet: start_kubelet).
add_node() {
    local i="$1" name ip veth
    name="$(node_name "$i")"
    ip="$(node_ip "$i")"
    veth="nodeipam-h$i"
    ip netns add "$name"
    ip link add "$veth" type veth peer name eth0 netns "$name"
    ip link set "$veth" master "$HOST_BRIDGE" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$ip/24" dev eth0
    ip -n "$name" link set eth0 up
    # Only the service range leaves the bridge's subnet: through the host (its DNAT rule).
    ip -n "$name" route add "$SERVICE_CIDR" via "$NODE_IP"
    node_cgroup_root "$name"
    start_containerd "$i"
    import_images "$i"
}

node_has_pod_cidr() {
    [[ -n "$(KUBECTL get node "$1" -o jsonpath='{.spec.podCIDR}')" ]]
}

install_controller() {
    local replicas=() i name
    # The chart's two replicas need two Nodes (anti-affinity).
    (($(node_count) > 1)) || replicas=(--set replicas=1)
    "$BIN/helm" --kubeconfig "$STATE/admin.kubeconfig" install nodeipam "$ROOT/charts/nodeipam" \
        --namespace kube-system --set controller.clusterCIDR="$CLUSTER_CIDR" \
        --set controller.serviceClusterIPRange="$SERVICE_CIDR" \
        --set image.repository="$CONTROLLER_REPOSITORY" --set image.tag="$CONTROLLER_TAG" \
        "${replicas[@]}" >/dev/null
    for ((i = 0; i < $(node_count); i++)); do
        name="$(node_name "$i")"
        wait_for "$name's podCIDR" 120 node_has_pod_cidr "$name"
    done
    wait_for "the controller's rollout" 120 KUBECTL -n kube-system rollout status \
        deployment/nodeipam-controller --timeout=1s
    for ((i = 0; i < $(node_count); i++)); do
        name="$(node_name "$i")"
        wait_for "Node $name Ready" 120 KUBECTL wait --for=condition=Ready "node/$name" --timeout=1s
    done
}

up_exit() {
    local status=$?
    [[ "$UP_DONE" == true ]] && return 0
    trap - EXIT INT TERM HUP
    log "up failed; tearing down"
    NODEIPAM_CLUSTER_KEEP_LOGS="${NODEIPAM_CLUSTER_KEEP_LOGS:-$STATE.failed-logs}" down_locked || true
    exit "$((status == 0 ? 1 : status))"
}

up() {
    local controller=true nodes=1 i
    while (($# > 0)); do
        case "$1" in
        --no-controller) controller=false ;;
        --nodes)
            nodes="${2:-}"
            shift
            ;;
        *) die "up [--nodes N] [--no-controller]: unknown argument $1" ;;
        esac
        shift
    done
    if ! [[ "$nodes" =~ ^[1-9]$ ]] || ((nodes > MAX_NODES)); then die "--nodes: 1 to $MAX_NODES"; fi
    [[ "$(id -u)" == 0 ]] || die "needs root (the kubelet, containerd, iptables, mounts)"
    exec 9>"$LOCK"
    flock -n 9 || die "another cluster.sh holds $LOCK"
    [[ -e "$STATE/up" ]] && die "a cluster is up in $STATE: run '$0 down' first"
    local start=$SECONDS
    install_packages
    upstream_bin
    controller_bin
    if findmnt -rn -o TARGET | grep -q "^$STATE/"; then
        die "mounts are left under $STATE (a failed down?): run '$0 down' first"
    fi
    rm -rf "$STATE"
    mkdir -p "$STATE"/{host,logs,pids}
    record_host
    echo "$BIN" >"$STATE/bin"
    echo "$CONTROLLER_BIN" >"$STATE/controller-bin"
    date -u +%FT%TZ >"$STATE/up"
    echo "$nodes" >"$STATE/nodes"
    # From here on, a failure (or a signal) tears everything down again. An EXIT trap, not ERR:
    # with `set -E` an ERR trap also runs inside command substitutions.
    UP_DONE=false
    trap 'up_exit' EXIT
    trap 'exit 130' INT TERM HUP
    build_images
    setup_network
    make_pki
    start_control_plane
    start_containerd 0
    import_images 0
    for ((i = 1; i < nodes; i++)); do
        add_node "$i"
    done
    # The kubelets start together and register meanwhile.
    for ((i = 0; i < nodes; i++)); do
        start_kubelet "$i"
    done
    for ((i = 0; i < nodes; i++)); do
        register_node "$i"
    done
    if [[ "$controller" == true ]]; then
        install_controller
        KUBECTL get nodes -o custom-columns=NODE:.metadata.name,PODCIDR:.spec.podCIDR >&2
    fi
    UP_DONE=true
    log "up in $((SECONDS - start))s"
    echo "export KUBECONFIG=$STATE/admin.kubeconfig"
}

# ----- commands on a running cluster -------------------------------------------------------------
running_cluster() {
    [[ "$(id -u)" == 0 ]] || die "needs root"
    [[ -e "$STATE/up" && -f "$STATE/bin" ]] || die "no cluster is up in $STATE"
    BIN="$(cat "$STATE/bin")"
}

# The log after the last restart marker has kube-controller-manager's "Starting controller".
kcm_started_since_restart() {
    local log="$STATE/logs/kube-controller-manager.log" n
    n="$(grep -n '^--- restarted with' "$log" | tail -n 1 | cut -d: -f1)"
    (($(tail -n +"${n:-1}" "$log" | grep -c 'Starting controller') > 0))
}

# restart_kcm FLAG...: kube-controller-manager again, with FLAGs after the usual ones (what an
# operator's edit of its static Pod does); waits until it has started its controllers.
restart_kcm() {
    running_cluster
    stop_pid kube-controller-manager
    rm -f "$STATE/pids/kube-controller-manager"
    echo "--- restarted with: $*" >>"$STATE/logs/kube-controller-manager.log"
    start_kcm "$@"
    wait_for "kube-controller-manager's controllers" 60 kcm_started_since_restart
}

# hollow_add NAME...: one kubemark hollow kubelet per NAME (upstream's kubelet code: registration,
# status updates, Lease heartbeats; a fake container runtime), with its own client certificate
# (system:node:NAME, so the Node authorizer and NodeRestriction apply as to a real kubelet) and
# its own port; its temporary folders stay in the state folder.
hollow_add() {
    running_cluster
    local name port
    mkdir -p "$STATE/hollow"
    [[ -f "$STATE/hollow/next-port" ]] || echo 20000 >"$STATE/hollow/next-port"
    for name in "$@"; do
        [[ -f "$STATE/pids/hollow-$name" ]] && die "hollow Node $name is already running"
        cert "node-$name" "/O=system:nodes/CN=system:node:$name"
        kubeconfig "node-$name" "system:node:$name"
        port="$(cat "$STATE/hollow/next-port")"
        echo $((port + 1)) >"$STATE/hollow/next-port"
        start "hollow-$name" env TMPDIR="$STATE/hollow" "$BIN/kubemark" --morph=kubelet \
            --name="$name" --kubeconfig="$STATE/node-$name.kubeconfig" \
            --use-host-image-service=false --kubelet-port="$port" --kubelet-read-only-port=0 \
            --node-labels=nodeipam.io/hollow=true
    done
}

# hollow_delete NAME...: stop those hollow kubelets (their Node objects stay: delete them with
# kubectl as an operator would).
hollow_delete() {
    running_cluster
    local name
    for name in "$@"; do
        stop_pid "hollow-$name"
        rm -f "$STATE/pids/hollow-$name"
    done
}

# ----- tear-down -----------------------------------------------------------------------------------
stop_pid() {
    local name="$1" pid i
    [[ -f "$STATE/pids/$name" ]] || return 0
    pid="$(cat "$STATE/pids/$name")"
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
}

# stop_pids PIDFILE...: SIGTERM to all at once, SIGKILL to those still running 10 s later.
stop_pids() {
    local p pids=() i
    for p in "$@"; do
        [[ -f "$p" ]] && kill -TERM "$(cat "$p")" 2>/dev/null && pids+=("$(cat "$p")")
    done
    for ((i = 0; i < 50 && ${#pids[@]} > 0; i++)); do
        for p in "${!pids[@]}"; do
            kill -0 "${pids[$p]}" 2>/dev/null || unset 'pids[p]'
        done
        ((${#pids[@]} == 0)) || sleep 0.2
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}

# Processes started by our containerds: their shims carry a socket path in the state folder on
# their command line.
our_shims() {
    local p
    for p in /proc/[0-9]*; do
        if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "-address $STATE/"; then
            basename "$p"
        fi
    done
}

# The cgroups of the kubelets (Node 0's kubepods, the other Nodes' cgroup roots) and containerd.
kubepods_cgroups() {
    local c n
    for c in /sys/fs/cgroup/*/; do
        [[ -d "$c/kubepods" ]] && echo "$c/kubepods"
        [[ -d "$c/k8s.io" ]] && echo "$c/k8s.io"
        for n in "$c"nodeipam-node-*; do
            [[ -d "$n" ]] && echo "$n"
        done
    done
    return 0
}

# Our Nodes' network namespaces and veths (Nodes 1…).
our_netns() { ip netns list 2>/dev/null | awk '$1 ~ /^nodeipam-node-[0-9]+$/ { print $1 }'; }
our_veths() { ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); if ($2 ~ /^nodeipam-h[0-9]+$/) print $2 }'; }

down_locked() {
    local failed=0 p t c chain rule n
    [[ -d "$STATE" ]] || {
        log "nothing in $STATE"
        return 0
    }
    if [[ -n "${NODEIPAM_CLUSTER_KEEP_LOGS:-}" && -d "$STATE/logs" ]]; then
        mkdir -p "$NODEIPAM_CLUSTER_KEEP_LOGS"
        cp -a "$STATE/logs/." "$NODEIPAM_CLUSTER_KEEP_LOGS/" || true
        # The containers' logs (the controller's among them), as the kubelet wrote them.
        if [[ -d /var/log/pods ]] && ! grep -qx /var/log/pods "$STATE/host/paths" 2>/dev/null; then
            cp -a /var/log/pods "$NODEIPAM_CLUSTER_KEEP_LOGS/pods" 2>/dev/null || true
        fi
        for p in "$STATE"/node-*/pod-logs; do
            [[ -d "$p" ]] || continue
            t="$(basename "$(dirname "$p")")"
            cp -a "$p" "$NODEIPAM_CLUSTER_KEEP_LOGS/pods-$t" 2>/dev/null || true
        done
        log "logs copied to $NODEIPAM_CLUSTER_KEEP_LOGS"
    fi
    # No new Pods, then let the kubelet stop its Pods the ordinary way (CNI DEL frees the address,
    # the sandbox's network namespace goes).
    stop_pid kube-controller-manager
    stop_pid kube-scheduler
    stop_pids "$STATE"/pids/hollow-*
    if [[ -f "$STATE/pids/kubelet" ]] && kill -0 "$(cat "$STATE/pids/kubelet")" 2>/dev/null &&
        apiserver_ready 2>/dev/null; then
        KUBECTL delete pods --all-namespaces --all --grace-period=0 --force --wait=false \
            >/dev/null 2>&1 || true
        for ((n = 0; n < 100; n++)); do
            local busy=false i
            for ((i = 0; i < $(node_count); i++)); do
                [[ -z "$(CTR_NODE "$i" tasks ls -q 2>/dev/null)" ]] || busy=true
            done
            [[ "$busy" == true ]] || break
            sleep 0.2
        done
    fi
    stop_pids "$STATE"/pids/kubelet "$STATE"/pids/kubelet-node-*
    # Whatever is left: kill the containers' processes (their cgroups), then the shims.
    for c in $(kubepods_cgroups); do
        # shellcheck disable=SC2038 # xargs reads the pids in cgroup.procs, not file names
        find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    done
    stop_pids "$STATE"/pids/containerd "$STATE"/pids/containerd-node-*
    for p in $(our_shims); do kill -KILL "$p" 2>/dev/null || true; done
    stop_pid kube-apiserver
    stop_pid etcd
    sleep 0.5
    # Mounts under the state folder, the kubelet's hard-coded folders and the sandboxes' network
    # namespaces, deepest first.
    for ((n = 0; n < 3; n++)); do
        while read -r t; do
            umount "$t" 2>/dev/null || umount -l "$t" 2>/dev/null || true
        done < <(findmnt -rn -o TARGET | grep -E "^($STATE|/var/lib/kubelet|/run/netns/cni-|/var/run/netns/cni-|/run/containerd)" | sort -r)
    done
    if [[ -d /run/netns ]]; then
        for n in /run/netns/cni-*; do
            [[ -e "$n" ]] || continue
            grep -qx "$(basename "$n")" "$STATE/host/netns" 2>/dev/null || rm -f "$n"
        done
    fi
    # The other Nodes' namespaces (their CNI bridges and the veths' inner ends go with them).
    for n in $(our_netns); do ip netns del "$n" 2>/dev/null || true; done
    for n in $(our_veths); do ip link del "$n" 2>/dev/null || true; done
    if mountpoint -q /run/netns 2>/dev/null && ! grep -qx /run/netns "$STATE/host/netns-mount" 2>/dev/null; then
        umount /run/netns 2>/dev/null || umount -l /run/netns 2>/dev/null || true
    fi
    ip link del "$POD_BRIDGE" 2>/dev/null || true
    ip link del "$HOST_BRIDGE" 2>/dev/null || true
    # iptables: our chain, then every chain the kubelet or the CNI added (rules jumping to it
    # first).
    iptables -t nat -D OUTPUT -j "$NAT_CHAIN" 2>/dev/null || true
    iptables -t nat -D PREROUTING -j "$NAT_CHAIN" 2>/dev/null || true
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        for t in filter nat mangle raw; do
            for chain in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" { print $2 }'); do
                grep -qx -- "$chain" "$STATE/host/$ipt-$t" 2>/dev/null && continue
                while read -r rule; do
                    # shellcheck disable=SC2086 # a rule from -S, split as iptables printed it
                    "$ipt" -t "$t" ${rule/-A/-D} 2>/dev/null || true
                done < <("$ipt" -t "$t" -S | grep -E -- "-j $chain( |\$)" || true)
                "$ipt" -t "$t" -F "$chain" 2>/dev/null || true
            done
            for chain in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" { print $2 }'); do
                grep -qx -- "$chain" "$STATE/host/$ipt-$t" 2>/dev/null && continue
                "$ipt" -t "$t" -X "$chain" 2>/dev/null || true
            done
        done
    done
    # cgroups the kubelet and containerd made, deepest first.
    for c in $(kubepods_cgroups); do
        find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    # Host settings back as they were.
    if [[ -f "$STATE/host/sysctl" ]]; then
        while read -r p t; do
            [[ "$(cat "/proc/sys/$p")" == "$t" ]] || echo "$t" >"/proc/sys/$p" || true
        done <"$STATE/host/sysctl"
    fi
    for p in "${OUTSIDE_PATHS[@]}"; do
        grep -qx -- "$p" "$STATE/host/paths" 2>/dev/null || rm -rf "$p"
    done
    [[ -d /var/lib/cni/networks/nodeipam ]] && rm -rf /var/lib/cni/networks/nodeipam
    for p in /tmp/hollow-kubelet.*; do
        [[ -e "$p" ]] || continue
        grep -qx -- "$p" "$STATE/host/hollow-tmp" 2>/dev/null || rm -rf "$p"
    done
    local host="$STATE/host.saved"
    rm -rf "$host"
    cp -a "$STATE/host" "$host" 2>/dev/null || true
    rm -rf "$STATE" || failed=1
    # Check: nothing of ours is left.
    local left=()
    [[ -z "$(findmnt -rn -o TARGET | grep -E "^($STATE|/var/lib/kubelet|/run/netns/cni-)" || true)" ]] || left+=(mounts)
    ip link show "$HOST_BRIDGE" >/dev/null 2>&1 && left+=("link $HOST_BRIDGE")
    ip link show "$POD_BRIDGE" >/dev/null 2>&1 && left+=("link $POD_BRIDGE")
    [[ -z "$(our_netns)" ]] || left+=("network namespaces $(our_netns | paste -sd' ')")
    [[ -z "$(our_veths)" ]] || left+=("links $(our_veths | paste -sd' ')")
    if mountpoint -q /run/netns 2>/dev/null && ! grep -qx /run/netns "$host/netns-mount" 2>/dev/null; then
        left+=("mount /run/netns")
    fi
    [[ -z "$(kubepods_cgroups)" ]] || left+=("cgroups $(kubepods_cgroups | paste -sd' ')")
    [[ -z "$(our_shims)" ]] || left+=("shim processes $(our_shims | paste -sd' ')")
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null || continue
        for t in filter nat mangle raw; do
            for chain in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" { print $2 }'); do
                grep -qx -- "$chain" "$host/$ipt-$t" 2>/dev/null || left+=("$ipt -t $t chain $chain")
            done
        done
    done
    for p in "${OUTSIDE_PATHS[@]}"; do
        [[ -e "$p" ]] && ! grep -qx -- "$p" "$host/paths" 2>/dev/null && left+=("$p")
    done
    for p in /tmp/hollow-kubelet.*; do
        [[ -e "$p" ]] && ! grep -qx -- "$p" "$host/hollow-tmp" 2>/dev/null && left+=("$p")
    done
    rm -rf "$host"
    if ((${#left[@]} > 0)); then
        log "left behind: ${left[*]}"
        return 1
    fi
    log "down: nothing left behind"
    return "$failed"
}

down() {
    [[ "$(id -u)" == 0 ]] || die "needs root"
    exec 9>"$LOCK"
    flock -w 5 9 || die "another cluster.sh holds $LOCK"
    local status=0
    down_locked || status=$?
    rm -f "$LOCK"
    return "$status"
}

status() {
    local p
    for p in "$STATE"/pids/*; do
        [[ -f "$p" ]] || continue
        if kill -0 "$(cat "$p")" 2>/dev/null; then
            echo "$(basename "$p"): running (pid $(cat "$p"))"
        else
            echo "$(basename "$p"): not running"
        fi
    done
    KUBECTL get nodes,pods -A -o wide
}

# Sourced (for a step by hand), only the functions are defined.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
case "${1:-}" in
up)
    shift
    up "$@"
    ;;
deps)
    [[ "$(id -u)" == 0 ]] || die "needs root (apt-get)"
    install_packages
    upstream_bin
    log "packages and $BIN ready"
    ;;
kcm)
    shift
    restart_kcm "$@"
    ;;
hollow)
    shift
    case "${1:-}" in
    add)
        shift
        hollow_add "$@"
        ;;
    delete)
        shift
        hollow_delete "$@"
        ;;
    *) die "hollow add|delete NAME..." ;;
    esac
    ;;
down) down ;;
status) status ;;
env) echo "export KUBECONFIG=$STATE/admin.kubeconfig" ;;
*)
    sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
