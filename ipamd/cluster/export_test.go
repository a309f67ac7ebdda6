package cluster

import (
	"context"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// NewWithClients is New on the given clients instead of an API server
// configuration, for tests with client-go's fake clientsets (inside a
// testing/synctest bubble, where time is fake); the health probe asks cs's
// discovery for the server version.
func NewWithClients(o Options, cs kubernetes.Interface, dyn dynamic.Interface) (*Cluster, error) {
	o.Config = &rest.Config{Host: "fake"}
	return newCluster(o, func(c *Cluster) error {
		c.api.probe = func(context.Context) error {
			_, err := cs.Discovery().ServerVersion()
			return err
		}
		return c.wireClients(cs, dyn)
	})
}
