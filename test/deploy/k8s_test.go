package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"
)

const k8sDir = "deploy/k8s"

// k8sKinds are the kinds the manifests may hold, each decoded strictly
// into its API type, so a misspelt or misplaced field fails.
var k8sKinds = map[string]struct {
	apiVersion string
	object     func() any
}{
	"Namespace":               {"v1", func() any { return &corev1.Namespace{} }},
	"ConfigMap":               {"v1", func() any { return &corev1.ConfigMap{} }},
	"Secret":                  {"v1", func() any { return &corev1.Secret{} }},
	"Service":                 {"v1", func() any { return &corev1.Service{} }},
	"Deployment":              {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"Job":                     {"batch/v1", func() any { return &batchv1.Job{} }},
	"PodDisruptionBudget":     {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"HorizontalPodAutoscaler": {"autoscaling/v2", func() any { return &autoscalingv2.HorizontalPodAutoscaler{} }},
}

type manifests struct {
	files       map[string][]any // relative path -> objects
	namespaces  []*corev1.Namespace
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    []*corev1.Service
	deployments map[string]*appsv1.Deployment
	jobs        []*batchv1.Job
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
}

var documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// loadManifests decodes every YAML file under deploy/k8s except the
// kustomizations. Objects of the prometheus-adapter folder are kept apart
// (they belong to another namespace).
func loadManifests(t *testing.T, sub string) manifests {
	t.Helper()
	root := repoRoot(t)
	m := manifests{
		files: map[string][]any{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, deployments: map[string]*appsv1.Deployment{},
	}
	dir := filepath.Join(root, filepath.FromSlash(k8sDir), sub)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.IsDir() || e.Name() == "kustomization.yaml" || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		for i, doc := range documentSeparator.Split(string(raw), -1) {
			var head metav1.TypeMeta
			require.NoError(t, sigsyaml.Unmarshal([]byte(doc), &head), "%s document %d", e.Name(), i)
			if head.Kind == "" {
				require.Empty(t, strings.TrimSpace(stripComments(doc)), "%s document %d has no kind", e.Name(), i)
				continue
			}
			kind, ok := k8sKinds[head.Kind]
			require.True(t, ok, "%s: kind %s is not expected here", e.Name(), head.Kind)
			require.Equal(t, kind.apiVersion, head.APIVersion, "%s: %s", e.Name(), head.Kind)
			obj := kind.object()
			require.NoError(t, sigsyaml.UnmarshalStrict([]byte(doc), obj), "%s: %s", e.Name(), head.Kind)
			m.files[e.Name()] = append(m.files[e.Name()], obj)
			switch o := obj.(type) {
			case *corev1.Namespace:
				m.namespaces = append(m.namespaces, o)
			case *corev1.ConfigMap:
				m.configMaps[o.Name] = o
			case *corev1.Secret:
				m.secrets[o.Name] = o
			case *corev1.Service:
				m.services = append(m.services, o)
			case *appsv1.Deployment:
				m.deployments[o.Name] = o
			case *batchv1.Job:
				m.jobs = append(m.jobs, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			case *autoscalingv2.HorizontalPodAutoscaler:
				m.hpas = append(m.hpas, o)
			}
		}
	}
	return m
}

func stripComments(doc string) string {
	var keep []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Labels     []struct {
		Pairs            map[string]string `yaml:"pairs"`
		IncludeSelectors bool              `yaml:"includeSelectors"`
	} `yaml:"labels"`
	Images []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

// TestKustomization checks that kustomization.yaml lists every manifest
// of its folder (a forgotten file is never applied) and names the image the
// containers use.
func TestKustomization(t *testing.T) {
	root := repoRoot(t)
	var k kustomization
	decodeStrict(t, filepath.Join(root, filepath.FromSlash(k8sDir), "kustomization.yaml"), &k)
	require.Equal(t, "kustomize.config.k8s.io/v1beta1", k.APIVersion)
	require.Equal(t, "Kustomization", k.Kind)

	m := loadManifests(t, "")
	listed := append([]string(nil), k.Resources...)
	sort.Strings(listed)
	require.Equal(t, sortedKeys(m.files), listed, "kustomization.yaml resources must be exactly the manifests beside it")

	require.Len(t, m.namespaces, 1)
	require.Equal(t, m.namespaces[0].Name, k.Namespace)
	for _, objs := range m.files {
		for _, o := range objs {
			if meta, ok := o.(metav1.Object); ok && meta.GetNamespace() != "" {
				require.Equal(t, k.Namespace, meta.GetNamespace(), "%s", meta.GetName())
			}
		}
	}

	image := settleImage(t, m)
	name, tag, _ := strings.Cut(image, ":")
	require.Len(t, k.Images, 1)
	require.Equal(t, name, k.Images[0].Name, "kustomize's images entry must name the containers' image")
	require.Equal(t, tag, k.Images[0].NewTag, "the manifests and kustomization.yaml pin the same tag")
}

// podSpecs are the settle pod templates: Deployments and the Job.
func podSpecs(m manifests) map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for name, d := range m.deployments {
		out["Deployment "+name] = &d.Spec.Template
	}
	for _, j := range m.jobs {
		out["Job "+j.Name] = &j.Spec.Template
	}
	return out
}

// settleImage is the one image every settle container runs.
func settleImage(t *testing.T, m manifests) string {
	t.Helper()
	image := ""
	for where, pod := range podSpecs(m) {
		for _, c := range pod.Spec.Containers {
			if image == "" {
				image = c.Image
			}
			require.Equal(t, image, c.Image, "%s container %s runs another image", where, c.Name)
		}
	}
	require.Regexp(t, `^[a-z0-9./-]+:[A-Za-z0-9._-]+$`, image, "pin a tag")
	require.NotContains(t, image, ":latest")
	return image
}

// containerBinary is the settle binary a container runs.
func containerBinary(t *testing.T, where string, c corev1.Container) string {
	t.Helper()
	require.NotEmpty(t, c.Command, "%s: the image serves several binaries; name one in command", where)
	require.True(t, strings.HasPrefix(c.Command[0], "/usr/local/bin/"), "%s: command %v", where, c.Command)
	b := filepath.Base(c.Command[0])
	require.Contains(t, builtBinaries(t), b, "%s runs %s, which the image does not have", where, b)
	return b
}

// containerEnv collects a container's environment: its env entries (values
// of literal ones, nil for references) and the keys of the ConfigMaps and
// Secrets it imports whole. References must resolve unless optional.
func containerEnv(t *testing.T, m manifests, where string, c corev1.Container) map[string]*string {
	t.Helper()
	env := map[string]*string{}
	set := func(name string, v *string) {
		_, dup := env[name]
		require.False(t, dup, "%s sets %s twice", where, name)
		env[name] = v
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := m.configMaps[from.ConfigMapRef.Name]
			require.True(t, ok, "%s imports ConfigMap %s, which no manifest defines", where, from.ConfigMapRef.Name)
			for k, v := range cm.Data {
				set(k, &v)
			}
		case from.SecretRef != nil:
			s, ok := m.secrets[from.SecretRef.Name]
			require.True(t, ok, "%s imports Secret %s, which no manifest defines", where, from.SecretRef.Name)
			for k := range s.StringData {
				set(k, nil)
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, &e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, ok := m.secrets[ref.Name]
			require.True(t, ok, "%s: %s refers to Secret %s, which no manifest defines", where, e.Name, ref.Name)
			v, ok := s.StringData[ref.Key]
			if ref.Optional == nil || !*ref.Optional {
				require.True(t, ok, "%s: %s refers to key %s, missing from Secret %s", where, e.Name, ref.Key, ref.Name)
			}
			if ok {
				set(e.Name, &v)
			} else {
				set(e.Name, nil)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := m.configMaps[ref.Name]
			require.True(t, ok, "%s: %s refers to ConfigMap %s, which no manifest defines", where, e.Name, ref.Name)
			v, ok := cm.Data[ref.Key]
			require.True(t, ok || (ref.Optional != nil && *ref.Optional), "%s: %s refers to a missing key", where, e.Name)
			set(e.Name, &v)
		default:
			set(e.Name, nil)
		}
	}
	return env
}

// TestK8sWorkloads checks each settle container: the binary it runs, its
// environment against that binary's code, probes on /healthz and /readyz
// at the binary's port, resources, a locked-down security context, and a
// grace period longer than SHUTDOWN_TIMEOUT.
func TestK8sWorkloads(t *testing.T) {
	m := loadManifests(t, "")
	byBinary := map[string]string{}
	for name, d := range m.deployments {
		where := "Deployment " + name
		require.Equal(t, d.Spec.Selector.MatchLabels, pickLabels(d.Spec.Template.Labels, d.Spec.Selector.MatchLabels), "%s: the selector must match the pod labels", where)
		require.Len(t, d.Spec.Template.Spec.Containers, 1, where)
		c := d.Spec.Template.Spec.Containers[0]
		binary := containerBinary(t, where, c)
		require.Empty(t, byBinary[binary], "%s and %s both run %s", byBinary[binary], name, binary)
		byBinary[binary] = name
		env := containerEnv(t, m, where, c)
		checkEnv(t, where, binary, env, requiredSettings(t, binary))
		if binary == "worker" {
			policy := env["DEPOSIT_FINALITY"]
			if policy == nil || *policy != "none" {
				_, ok := env["ETH_RPC_URL"]
				require.True(t, ok, "%s: DEPOSIT_FINALITY other than none needs ETH_RPC_URL", where)
			}
		}

		port := int32(binaries[binary].port)
		if v := env[binaries[binary].addrSetting]; v != nil {
			require.Equal(t, ":"+strconv.Itoa(int(port)), *v, "%s listens on %s", where, *v)
		}
		require.True(t, hasContainerPort(c, port), "%s declares no container port %d", where, port)
		checkProbe(t, where+" liveness", c, c.LivenessProbe, "/healthz", port)
		checkProbe(t, where+" readiness", c, c.ReadinessProbe, "/readyz", port)
		if c.StartupProbe != nil {
			checkProbe(t, where+" startup", c, c.StartupProbe, "/healthz", port)
		}

		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		require.NotNil(t, grace, "%s: set terminationGracePeriodSeconds above SHUTDOWN_TIMEOUT", where)
		need := 30 * time.Second
		if v := env["SHUTDOWN_TIMEOUT"]; v != nil {
			var err error
			need, err = time.ParseDuration(*v)
			require.NoError(t, err, "%s SHUTDOWN_TIMEOUT", where)
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			need += time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
		require.Greater(t, time.Duration(*grace)*time.Second, need, "%s: the grace period must outlast preStop + SHUTDOWN_TIMEOUT", where)
	}
	for _, b := range []string{"api", "worker", "scheduler"} {
		require.NotEmpty(t, byBinary[b], "no Deployment runs %s", b)
	}
	require.Nil(t, m.deployments[byBinary["worker"]].Spec.Replicas, "the HPA owns the worker count: leave replicas out")
	require.Equal(t, int32(2), *m.deployments[byBinary["scheduler"]].Spec.Replicas, "two schedulers")

	require.Len(t, m.jobs, 1)
	job := m.jobs[0]
	require.Len(t, job.Spec.Template.Spec.Containers, 1)
	c := job.Spec.Template.Spec.Containers[0]
	require.Equal(t, []string{"/usr/local/bin/api", "migrate"}, c.Command, "the migrate Job runs `api migrate`")
	require.Contains(t, []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure}, job.Spec.Template.Spec.RestartPolicy)
	checkEnv(t, "Job "+job.Name, "api", containerEnv(t, m, "Job "+job.Name, c), []string{"DATABASE_URL"})

	settleImage(t, m)
	for where, pod := range podSpecs(m) {
		checkPodSecurity(t, where, pod.Spec)
	}
}

func pickLabels(from, keys map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keys {
		if v, ok := from[k]; ok {
			out[k] = v
		}
	}
	return out
}

func hasContainerPort(c corev1.Container, port int32) bool {
	for _, p := range c.Ports {
		if p.ContainerPort == port {
			return true
		}
	}
	return false
}

// resolvePort turns a named or numbered port into the container's number.
func resolvePort(t *testing.T, where string, c corev1.Container, port intstr.IntOrString) int32 {
	t.Helper()
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return p.ContainerPort
		}
	}
	t.Fatalf("%s: no container port named %q", where, port.StrVal)
	return 0
}

func checkProbe(t *testing.T, where string, c corev1.Container, p *corev1.Probe, path string, port int32) {
	t.Helper()
	require.NotNil(t, p, "%s probe missing", where)
	require.NotNil(t, p.HTTPGet, "%s: an HTTP probe", where)
	require.Equal(t, path, p.HTTPGet.Path, where)
	require.Equal(t, port, resolvePort(t, where, c, p.HTTPGet.Port), "%s probes the wrong port", where)
}

func checkPodSecurity(t *testing.T, where string, spec corev1.PodSpec) {
	t.Helper()
	sc := spec.SecurityContext
	require.NotNil(t, sc, where)
	require.True(t, sc.RunAsNonRoot != nil && *sc.RunAsNonRoot, "%s: runAsNonRoot", where)
	require.True(t, sc.RunAsUser != nil && *sc.RunAsUser != 0, "%s: a non-zero runAsUser", where)
	require.True(t, sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault, "%s: seccomp RuntimeDefault", where)
	for _, c := range spec.Containers {
		w := where + " container " + c.Name
		csc := c.SecurityContext
		require.NotNil(t, csc, w)
		require.True(t, csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", w)
		require.True(t, csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation false", w)
		require.True(t, csc.Capabilities != nil && len(csc.Capabilities.Drop) == 1 && csc.Capabilities.Drop[0] == "ALL", "%s: drop ALL capabilities", w)
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, ok := c.Resources.Requests[res]
			require.True(t, ok, "%s: request %s", w, res)
			limit, ok := c.Resources.Limits[res]
			require.True(t, ok, "%s: limit %s", w, res)
			require.LessOrEqual(t, req.Cmp(limit), 0, "%s: %s request above its limit", w, res)
		}
	}
}

// matching returns the Deployments whose pods a selector selects.
func matching(t *testing.T, m manifests, sel *metav1.LabelSelector) []string {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	require.NoError(t, err)
	require.False(t, s.Empty(), "an empty selector selects everything")
	var out []string
	for name, d := range m.deployments {
		if s.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, name)
		}
	}
	return out
}

// TestK8sServicesAndBudgets checks that Services and PodDisruptionBudgets
// select exactly one Deployment's pods, that Service ports resolve, and
// that the api and the workers have a budget that still lets a node drain.
func TestK8sServicesAndBudgets(t *testing.T) {
	m := loadManifests(t, "")
	for _, s := range m.services {
		targets := matching(t, m, &metav1.LabelSelector{MatchLabels: s.Spec.Selector})
		require.Len(t, targets, 1, "Service %s must select one Deployment, selects %v", s.Name, targets)
		c := m.deployments[targets[0]].Spec.Template.Spec.Containers[0]
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			require.True(t, hasContainerPort(c, resolvePort(t, "Service "+s.Name, c, target)), "Service %s port %s", s.Name, p.Name)
		}
	}
	budgeted := map[string]*policyv1.PodDisruptionBudget{}
	for _, pdb := range m.pdbs {
		targets := matching(t, m, pdb.Spec.Selector)
		require.Len(t, targets, 1, "PodDisruptionBudget %s must select one Deployment, selects %v", pdb.Name, targets)
		budgeted[targets[0]] = pdb
	}
	for name, d := range m.deployments {
		binary := filepath.Base(d.Spec.Template.Spec.Containers[0].Command[0])
		if binary != "api" && binary != "worker" {
			continue
		}
		pdb := budgeted[name]
		require.NotNil(t, pdb, "Deployment %s (%s) needs a PodDisruptionBudget", name, binary)
		if pdb.Spec.MinAvailable != nil && d.Spec.Replicas != nil {
			require.Less(t, pdb.Spec.MinAvailable.IntValue(), int(*d.Spec.Replicas), "PodDisruptionBudget %s would block every drain", pdb.Name)
		}
	}
}

// TestK8sAutoscaler checks the worker HPA: it scales the worker Deployment
// on settle_backlog_events, and prometheus-adapter's rule serves that metric
// with a query over exported series.
func TestK8sAutoscaler(t *testing.T) {
	m := loadManifests(t, "")
	require.Len(t, m.hpas, 1)
	hpa := m.hpas[0]
	ref := hpa.Spec.ScaleTargetRef
	require.Equal(t, "Deployment", ref.Kind)
	require.Equal(t, "apps/v1", ref.APIVersion)
	d, ok := m.deployments[ref.Name]
	require.True(t, ok, "the HPA scales %s, which no manifest defines", ref.Name)
	require.Equal(t, "/usr/local/bin/worker", d.Spec.Template.Spec.Containers[0].Command[0], "the HPA scales the workers")
	require.NotNil(t, hpa.Spec.MinReplicas)
	require.GreaterOrEqual(t, *hpa.Spec.MinReplicas, int32(2), "at least two workers, so a drain leaves one")
	require.Greater(t, hpa.Spec.MaxReplicas, *hpa.Spec.MinReplicas)

	metric := ""
	for _, ms := range hpa.Spec.Metrics {
		switch ms.Type {
		case autoscalingv2.ExternalMetricSourceType:
			metric = ms.External.Metric.Name
			require.Equal(t, autoscalingv2.AverageValueMetricType, ms.External.Target.Type, "scale per worker: AverageValue")
		case autoscalingv2.PodsMetricSourceType:
			metric = ms.Pods.Metric.Name
		}
	}
	// The real backlog, in PostgreSQL: settle_queue_depth stops at
	// QUEUE_DEPTH_MAX.
	require.Equal(t, "settle_backlog_events", metric, "the workers scale on the backlog")
	_, ok = exportedSeries(t)[metric]
	require.True(t, ok, "%s is not exported by settle", metric)

	// The adapter's rule that serves it.
	adapter := loadManifests(t, "prometheus-adapter")
	served := false
	for _, cm := range adapter.configMaps {
		var cfg struct {
			ExternalRules []struct {
				SeriesQuery string `yaml:"seriesQuery"`
				Resources   struct {
					Overrides map[string]struct {
						Resource string `yaml:"resource"`
					} `yaml:"overrides"`
				} `yaml:"resources"`
				Name struct {
					Matches string `yaml:"matches"`
					As      string `yaml:"as"`
				} `yaml:"name"`
				MetricsQuery string `yaml:"metricsQuery"`
			} `yaml:"externalRules"`
		}
		dec := yaml.NewDecoder(strings.NewReader(cm.Data["config.yaml"]))
		dec.KnownFields(true)
		require.NoError(t, dec.Decode(&cfg), "ConfigMap %s config.yaml", cm.Name)
		for _, r := range cfg.ExternalRules {
			if r.Name.As != metric {
				continue
			}
			served = true
			require.Equal(t, "namespace", r.Resources.Overrides["namespace"].Resource, "the HPA reads its own namespace's queue")
			// Kubernetes service discovery adds the namespace label.
			checkPromQL(t, "adapter seriesQuery", r.SeriesQuery, "namespace")
			query := strings.NewReplacer(
				"<<.Series>>", metric, "<<.LabelMatchers>>", `namespace="settle"`, "<<.GroupBy>>", "namespace",
			).Replace(r.MetricsQuery)
			checkPromQL(t, "adapter metricsQuery", query, "namespace")
		}
	}
	require.True(t, served, "prometheus-adapter has no external rule serving %s", metric)
}
