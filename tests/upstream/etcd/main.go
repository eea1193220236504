// Command etcd is upstream etcd's server, built from the published module
// go.etcd.io/etcd/server/v3 at the version go.mod pins: the same entry point as etcd's own
// binary (server/main.go in the etcd repository calls etcdmain.Main(os.Args)).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
