package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ReadObjects decodes the YAML (or JSON) documents of the files, skipping empty
// ones. A document without apiVersion or kind is an error naming the file.
func ReadObjects(paths ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for i := 0; ; i++ {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s document %d: %w", path, i, err)
			}
			if len(m) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			if u.GetAPIVersion() == "" || u.GetKind() == "" {
				return nil, fmt.Errorf("%s document %d: no apiVersion or kind", path, i)
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}

// ApplyFiles server-side applies every object in the files as admin (field
// manager "kubetest", conflicts forced), CustomResourceDefinitions first; it
// waits until each CRD is Established, so objects of its kind in the same
// files apply. Namespaced objects without a namespace go to "default".
func (s *Server) ApplyFiles(ctx context.Context, paths ...string) error {
	objs, err := ReadObjects(paths...)
	if err != nil {
		return err
	}
	return ApplyObjects(ctx, s.Config, objs...)
}

// ApplyObjects server-side applies objs with cfg's identity, CRDs first (waiting
// for them to be Established).
func ApplyObjects(ctx context.Context, cfg *rest.Config, objs ...*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	for _, o := range crds {
		if err := applyOne(ctx, dyn, mapper, o); err != nil {
			return err
		}
	}
	names := make([]string, len(crds))
	for i, o := range crds {
		names[i] = o.GetName()
	}
	if err := WaitEstablished(ctx, cfg, names...); err != nil {
		return err
	}
	mapper.Reset()
	for _, o := range rest {
		if err := applyOne(ctx, dyn, mapper, o); err != nil {
			return err
		}
	}
	return nil
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		ri = dyn.Resource(m.Resource).Namespace(ns)
	}
	force := true
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "kubetest", Force: &force})
	if err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
	}
	return nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// WaitEstablished waits until each named CustomResourceDefinition has
// condition Established=True and its names accepted (at most 30 s or ctx).
func WaitEstablished(ctx context.Context, cfg *rest.Config, names ...string) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, name := range names {
		var last string
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				cm, _ := c.(map[string]any)
				typ, status, msg := cm["type"], cm["status"], cm["message"]
				if typ == "Established" && status == "True" {
					return true, nil
				}
				if typ == "NamesAccepted" && status == "False" {
					return false, fmt.Errorf("names not accepted: %v", msg)
				}
			}
			last = "not Established yet"
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s: %w (%s)", name, err, last)
		}
	}
	return nil
}
