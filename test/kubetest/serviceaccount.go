package kubetest

import (
	"context"
	"fmt"
	"os"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// ReadRules reads RBAC policy rules from a file holding either a ClusterRole
// (or Role) object, a map with a top-level `rules:` list, or a bare YAML list
// of rules — the shapes a Helm chart keeps them in.
func ReadRules(path string) ([]rbacv1.PolicyRule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(data, &list); err == nil {
		return list, nil
	}
	var holder struct {
		Rules []rbacv1.PolicyRule `json:"rules"`
	}
	if err := yaml.Unmarshal(data, &holder); err != nil {
		return nil, fmt.Errorf("%s: neither a list of rules nor an object with rules: %w", path, err)
	}
	if len(holder.Rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", path)
	}
	return holder.Rules, nil
}

// ServiceAccountConfigFromFile is ServiceAccountConfig with the rules of a
// file (see ReadRules).
func (s *Server) ServiceAccountConfigFromFile(ctx context.Context, namespace, name, rulesFile string) (*rest.Config, error) {
	rules, err := ReadRules(rulesFile)
	if err != nil {
		return nil, err
	}
	return s.ServiceAccountConfig(ctx, namespace, name, rules)
}

// ServiceAccountConfig creates (or updates) ServiceAccount namespace/name, a
// ClusterRole "kubetest:<namespace>:<name>" holding exactly rules and a
// ClusterRoleBinding of the two, then returns a rest.Config that authenticates
// as the ServiceAccount with a one-hour token from the TokenRequest API. Calling
// it again with other rules replaces the role's rules.
func (s *Server) ServiceAccountConfig(ctx context.Context, namespace, name string, rules []rbacv1.PolicyRule) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return nil, err
	}
	if err := s.EnsureNamespace(ctx, namespace); err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("serviceaccount: %w", err)
	}
	roleName := "kubetest:" + namespace + ":" + name
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}
	if err := upsertClusterRole(ctx, cs, role); err != nil {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: roleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("clusterrolebinding: %w", err)
	}
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token request: %w", err)
	}
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.pki.caPEM},
		QPS:             s.Config.QPS, Burst: s.Config.Burst,
	}, nil
}

func upsertClusterRole(ctx context.Context, cs kubernetes.Interface, role *rbacv1.ClusterRole) error {
	_, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := cs.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		cur.Rules = role.Rules
		_, err = cs.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("clusterrole %s: %w", role.Name, err)
	}
	return nil
}

// PodTokenConfig returns a rest.Config that authenticates as the
// ServiceAccount of pod namespace/pod with a one-hour token bound to that
// pod (TokenRequest boundObjectRef), the token kubelet mounts into a pod's
// projected volume. The API server puts the pod's node in the token and in
// the user info of its requests (extra "authentication.kubernetes.io/node-name",
// Kubernetes 1.30 and later), which admission policies can match. The pod
// must exist with spec.nodeName set, and its Node too.
func (s *Server) PodTokenConfig(ctx context.Context, namespace, pod string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return nil, err
	}
	p, err := cs.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, pod, err)
	}
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, p.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token request bound to pod %s/%s: %w", namespace, pod, err)
	}
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.pki.caPEM},
		QPS:             s.Config.QPS, Burst: s.Config.Burst,
	}, nil
}

// ReadRulesFromObject returns the rules of a decoded ClusterRole (or Role),
// as helm template renders it (a map from a YAML decoder).
func ReadRulesFromObject(obj map[string]any) ([]rbacv1.PolicyRule, error) {
	data, err := yaml.Marshal(obj["rules"])
	if err != nil {
		return nil, err
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return rules, nil
}
