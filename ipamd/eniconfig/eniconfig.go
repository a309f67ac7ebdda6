// Package eniconfig reads, for custom networking, the ENIConfig this node
// selects (package podsubnet's ENIConfigSource) from the Kubernetes API:
// an informer on the ENIConfig objects (eniconfigs.crd.k8s.amazonaws.com,
// cluster-wide: a handful of objects, one per zone typically) through the
// dynamic client, and an informer on this node only (field selector
// metadata.name), for the labels and annotation that name its ENIConfig.
//
// It is a guest like the rest of the daemon's Kubernetes part: NodeENIConfig
// answers from the caches and never waits for the API server; until they
// have synced, or when the object is missing, it says so (an error wrapping
// podsubnet.ErrNoENIConfig) and the pool waits.
package eniconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcip/vpcip/ipamd/podsubnet"
)

// Resource is the ENIConfig resource.
var Resource = schema.GroupVersionResource{Group: podsubnet.ENIConfigGroup, Version: podsubnet.ENIConfigVersion, Resource: podsubnet.ENIConfigResource}

// resync is the informers' resync period: the caches never miss an event
// for long even if a watch silently broke.
const resync = 10 * time.Minute

// Options configure a Source.
type Options struct {
	Config   *rest.Config       // how to reach the API server
	NodeName string             // MY_NODE_NAME
	Keys     podsubnet.NodeKeys // ENI_CONFIG_ANNOTATION_DEF, ENI_CONFIG_LABEL_DEF
	Logger   *slog.Logger       // nil: discard
	// Changed is called when the node's selected ENIConfig (name or spec)
	// may have changed; nil: none.
	Changed func()
}

// Source is the node's ENIConfig as the API server shows it.
type Source struct {
	o              Options
	configs, nodes cache.SharedIndexInformer
	apiErrors      atomic.Int64 // failed lists and watches (the reflectors retry them)
}

var _ podsubnet.ENIConfigSource = (*Source)(nil)

// New wires the informers; it does no I/O.
func New(o Options) (*Source, error) {
	if o.Config == nil || o.NodeName == "" {
		return nil, errors.New("eniconfig: Options.Config and NodeName are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := rest.CopyConfig(o.Config)
	cfg.UserAgent = "vpcipd/" + o.NodeName
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Source{o: o}
	s.configs = cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return dyn.Resource(Resource).List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return dyn.Resource(Resource).Watch(ctx, opts)
		},
	}, &unstructured.Unstructured{}, resync, cache.Indexers{})
	byName := fields.OneTermEqualSelector("metadata.name", o.NodeName).String()
	s.nodes = cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = byName
			return cs.CoreV1().Nodes().List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = byName
			return cs.CoreV1().Nodes().Watch(ctx, opts)
		},
	}, &corev1.Node{}, resync, cache.Indexers{})
	for what, inf := range map[string]cache.SharedIndexInformer{"eniconfigs": s.configs, "node": s.nodes} {
		err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			s.apiErrors.Add(1)
			o.Logger.Warn("custom networking: list or watch failed (retried)", "resource", what, "err", err)
		})
		if err != nil {
			return nil, err
		}
	}
	if o.Changed != nil {
		h := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { o.Changed() },
			UpdateFunc: func(any, any) { o.Changed() },
			DeleteFunc: func(any) { o.Changed() },
		}
		if _, err := s.configs.AddEventHandler(h); err != nil {
			return nil, err
		}
		if _, err := s.nodes.AddEventHandler(h); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run runs the informers until ctx ends. Watch errors are retried by
// client-go with backoff; Run itself never fails.
func (s *Source) Run(ctx context.Context) error {
	s.o.Logger.Info("custom networking: watching ENIConfigs and the node", "node", s.o.NodeName)
	go s.configs.RunWithContext(ctx)
	go s.nodes.RunWithContext(ctx)
	<-ctx.Done()
	return nil
}

// APIErrors counts the failed lists and watches so far (each is retried).
func (s *Source) APIErrors() int64 { return s.apiErrors.Load() }

// NodeENIConfig returns the ENIConfig the node selects (podsubnet.ConfigName
// over its labels and annotations) and where its name came from. Errors wrap
// podsubnet.ErrNoENIConfig (caches not synced, node or ENIConfig missing) or
// podsubnet.ErrInvalidENIConfig (a spec field of the wrong type).
func (s *Source) NodeENIConfig() (podsubnet.ENIConfig, string, error) {
	if !s.configs.HasSynced() || !s.nodes.HasSynced() {
		return podsubnet.ENIConfig{}, "", fmt.Errorf("%w: ENIConfigs and node %s not read from the API server yet", podsubnet.ErrNoENIConfig, s.o.NodeName)
	}
	obj, ok, err := s.nodes.GetStore().GetByKey(s.o.NodeName)
	node, isNode := obj.(*corev1.Node)
	if err != nil || !ok || !isNode {
		return podsubnet.ENIConfig{}, "", fmt.Errorf("%w: node %s not found in the API server", podsubnet.ErrNoENIConfig, s.o.NodeName)
	}
	name, source := podsubnet.ConfigName(node.Labels, node.Annotations, s.o.Keys)
	cfg := podsubnet.ENIConfig{Name: name}
	obj, ok, err = s.configs.GetStore().GetByKey(name)
	u, isU := obj.(*unstructured.Unstructured)
	if err != nil || !ok || !isU {
		return cfg, source, fmt.Errorf("%w: ENIConfig %q (%s) does not exist", podsubnet.ErrNoENIConfig, name, source)
	}
	return parse(u, source)
}

// parse reads spec.subnet and spec.securityGroups of an ENIConfig object.
func parse(u *unstructured.Unstructured, source string) (podsubnet.ENIConfig, string, error) {
	cfg := podsubnet.ENIConfig{Name: u.GetName()}
	var err error
	if cfg.Subnet, _, err = unstructured.NestedString(u.Object, "spec", "subnet"); err != nil {
		return cfg, source, fmt.Errorf("%w: ENIConfig %q: spec.subnet: %v", podsubnet.ErrInvalidENIConfig, cfg.Name, err)
	}
	if cfg.SecurityGroups, _, err = unstructured.NestedStringSlice(u.Object, "spec", "securityGroups"); err != nil {
		return cfg, source, fmt.Errorf("%w: ENIConfig %q: spec.securityGroups: %v", podsubnet.ErrInvalidENIConfig, cfg.Name, err)
	}
	return cfg, source, nil
}
