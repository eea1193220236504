// Command cidrset-driver drives kube-controller-manager's node IPAM allocator,
// k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset at the release pinned in ../../go.mod,
// from a line protocol on stdin, one answer line per request line on stdout. It is the upstream
// half of nodeipam's differential test (nodeipam_tests::differential, test target
// upstream_differential); the other half speaks the same protocol over nodeipam-core.
//
// Requests (one per line; CIDRs as net.ParseCIDR reads them, host bits cleared as
// kube-controller-manager does):
//
//	new CIDR MASK   a new set: cluster CIDR CIDR cut into blocks of prefix length MASK (bits);
//	                it replaces the previous set
//	alloc           CidrSet.AllocateNext
//	occupy CIDR     CidrSet.Occupy
//	release CIDR    CidrSet.Release
//
// Answers:
//
//	new:     "ok blocks=N"                        | "err CLASS"
//	alloc:   "ok CIDR allocated=N tries=T"        | "err CLASS allocated=N"
//	occupy, release: "ok allocated=N"             | "err CLASS allocated=N"
//
// N and T are read from the package's own Prometheus metrics in component-base's legacy
// registry, without touching the set's unexported fields: blocks = cirdset_max_cidrs; allocated =
// the growth of cidrset_cidrs_allocations_total minus that of cidrset_cidrs_releases_total since
// "new" (both count changed bits); tries = the growth of the sum of
// cidrset_allocation_tries_per_request (the used blocks AllocateNext skipped from its
// next-candidate cursor). Every "new" resets the registry first (legacyregistry.Reset), so it
// holds one set's series and a gather costs the same at the end of a long batch as at its start.
// The cursor itself is unexported: the cursor before an allocation is
// (index of CIDR − tries) mod blocks, and after it index + 1 mod blocks.
//
// CLASS: no-cidrs-remaining (ErrCIDRRangeNoCIDRsRemaining), too-many-blocks
// (ErrCIDRSetSubNetTooBig), out-of-range ("is out the range of cluster cidr"),
// index-out-of-range ("is out of the range of CIDR allocator"), parse (a request that does not
// parse), no-set (no set yet, or the last "new" failed), bad-op (an unknown request), panic (the
// package panicked; the set is dropped), other (any other error, its text after a colon).
//
// Output is buffered and flushed whenever no more input is waiting, so a caller may write a whole
// batch before it reads.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset"
)

const (
	allocationsMetric = "node_ipam_controller_cidrset_cidrs_allocations_total"
	releasesMetric    = "node_ipam_controller_cidrset_cidrs_releases_total"
	maxCidrsMetric    = "node_ipam_controller_cirdset_max_cidrs"
	triesMetric       = "node_ipam_controller_cidrset_allocation_tries_per_request"
)

// counters are the package's metric values for one clusterCIDR label.
type counters struct {
	allocations, releases, triesSum, maxCidrs float64
}

// read gathers the legacy registry and returns the values labelled clusterCIDR=label.
func read(label string) (counters, error) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return counters{}, err
	}
	var c counters
	for _, family := range families {
		for _, m := range family.GetMetric() {
			if !hasLabel(m, label) {
				continue
			}
			switch family.GetName() {
			case allocationsMetric:
				c.allocations = m.GetCounter().GetValue()
			case releasesMetric:
				c.releases = m.GetCounter().GetValue()
			case maxCidrsMetric:
				c.maxCidrs = m.GetGauge().GetValue()
			case triesMetric:
				c.triesSum = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return c, nil
}

func hasLabel(m *dto.Metric, label string) bool {
	for _, pair := range m.GetLabel() {
		if pair.GetName() == "clusterCIDR" && pair.GetValue() == label {
			return true
		}
	}
	return false
}

// driver holds the current set, the metric values when it was made and after the last request
// (one gather per request: each costs tens of microseconds).
type driver struct {
	set   *cidrset.CidrSet
	label string
	base  counters
	last  counters
}

// refresh gathers the metrics after a request and returns the allocated count, or -1 if the
// registry could not be gathered (which then shows as a difference).
func (d *driver) refresh() int64 {
	now, err := read(d.label)
	if err != nil {
		return -1
	}
	d.last = now
	return int64((now.allocations - d.base.allocations) - (now.releases - d.base.releases))
}

func classify(err error) string {
	switch {
	case errors.Is(err, cidrset.ErrCIDRRangeNoCIDRsRemaining):
		return "no-cidrs-remaining"
	case errors.Is(err, cidrset.ErrCIDRSetSubNetTooBig):
		return "too-many-blocks"
	case strings.Contains(err.Error(), "is out the range of cluster cidr"):
		return "out-of-range"
	case strings.Contains(err.Error(), "is out of the range of CIDR allocator"):
		return "index-out-of-range"
	default:
		return "other:" + strings.ReplaceAll(err.Error(), " ", "_")
	}
}

// handle answers one request line; a panic inside the package is caught by the caller.
func (d *driver) handle(line string) string {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "err bad-op"
	}
	switch {
	case fields[0] == "new" && len(fields) == 3:
		d.set = nil
		_, cluster, err := net.ParseCIDR(fields[1])
		if err != nil {
			return "err parse"
		}
		mask, err := strconv.Atoi(fields[2])
		if err != nil {
			return "err parse"
		}
		// One set's series at a time: without this every cluster CIDR of a batch keeps its
		// series and each gather grows with the batch (to ~2 ms per request after 500 sets).
		// Before NewCIDRSet, which sets the max gauge.
		legacyregistry.Reset()
		set, err := cidrset.NewCIDRSet(cluster, mask)
		if err != nil {
			return "err " + classify(err)
		}
		d.label = cluster.String()
		base, err := read(d.label)
		if err != nil {
			return "err other:gather:" + err.Error()
		}
		d.set, d.base, d.last = set, base, base
		return fmt.Sprintf("ok blocks=%d", int64(base.maxCidrs))
	case fields[0] == "alloc" && len(fields) == 1:
		if d.set == nil {
			return "err no-set"
		}
		triesBefore := d.last.triesSum
		cidr, err := d.set.AllocateNext()
		if err != nil {
			return fmt.Sprintf("err %s allocated=%d", classify(err), d.refresh())
		}
		allocated := d.refresh()
		return fmt.Sprintf("ok %s allocated=%d tries=%d", cidr, allocated,
			int64(d.last.triesSum-triesBefore))
	case (fields[0] == "occupy" || fields[0] == "release") && len(fields) == 2:
		if d.set == nil {
			return "err no-set"
		}
		_, cidr, err := net.ParseCIDR(fields[1])
		if err != nil {
			return fmt.Sprintf("err parse allocated=%d", d.refresh())
		}
		if fields[0] == "occupy" {
			err = d.set.Occupy(cidr)
		} else {
			err = d.set.Release(cidr)
		}
		if err != nil {
			return fmt.Sprintf("err %s allocated=%d", classify(err), d.refresh())
		}
		return fmt.Sprintf("ok allocated=%d", d.refresh())
	default:
		return "err bad-op"
	}
}

// answer is handle with a panic turned into an answer (and the set dropped).
func (d *driver) answer(line string) (out string) {
	defer func() {
		if r := recover(); r != nil {
			d.set = nil
			out = "err panic:" + strings.ReplaceAll(fmt.Sprint(r), " ", "_")
		}
	}()
	return d.handle(line)
}

func main() {
	// The registry's process and Go runtime collectors would be gathered with every request;
	// only the cidrset metrics are read, so take those two out (same options as registered).
	reg := legacyregistry.Registerer()
	reg.Unregister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.Unregister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)))

	in := bufio.NewReaderSize(os.Stdin, 1<<16)
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	d := &driver{}
	for {
		if in.Buffered() == 0 {
			if err := out.Flush(); err != nil {
				os.Exit(1)
			}
		}
		line, err := in.ReadString('\n')
		if line != "" {
			fmt.Fprintln(out, d.answer(strings.TrimRight(line, "\r\n")))
		}
		if err != nil {
			break
		}
	}
	if err := out.Flush(); err != nil {
		os.Exit(1)
	}
}
