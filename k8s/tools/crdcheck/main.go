// crdcheck strictly decodes every custom resource of a rendered manifest stream into the real
// Go API types of the operator that serves it, with unknown fields disallowed: a misspelled or
// misplaced field, a wrong type or a kind this program does not know fails the check.
//
//	kustomize build k8s/overlays/small | crdcheck          # reads stdin
//	crdcheck rendered.yaml ...
//
// Types (versions pinned in go.mod):
//   - monitoring.coreos.com/v1 PodMonitor, ServiceMonitor, PrometheusRule:
//     github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1
//   - kubeflow.org/v1 PyTorchJob: github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1
//   - opentelemetry.io/v1beta1 OpenTelemetryCollector (k8s/components/operator):
//     github.com/open-telemetry/opentelemetry-operator/apis/v1beta1 (its spec.config is typed
//     down to the collector config's sections: receivers, processors, exporters, connectors,
//     extensions, service)
//
// Objects of other API groups (the core kinds) are skipped: they are validated elsewhere
// against the Kubernetes schemas. Prints one line per object; exits 1 on any failure.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	otelv1beta1 "github.com/open-telemetry/opentelemetry-operator/apis/v1beta1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// known maps apiVersion/kind to a constructor of the typed object.
var known = map[string]func() any{
	"monitoring.coreos.com/v1/PodMonitor":             func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/ServiceMonitor":         func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":         func() any { return &monitoringv1.PrometheusRule{} },
	"kubeflow.org/v1/PyTorchJob":                      func() any { return &kubeflowv1.PyTorchJob{} },
	"opentelemetry.io/v1beta1/OpenTelemetryCollector": func() any { return &otelv1beta1.OpenTelemetryCollector{} },
}

// coreGroups are served by the API server itself: not this program's business.
var coreGroups = map[string]bool{
	"v1": true, "apps/v1": true, "batch/v1": true, "rbac.authorization.k8s.io/v1": true,
	"networking.k8s.io/v1": true, "policy/v1": true, "autoscaling/v2": true,
}

func check(doc []byte) (string, error) {
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", fmt.Errorf("not a Kubernetes object: %w", err)
	}
	id := fmt.Sprintf("%s %s %s/%s", tm.APIVersion, tm.Kind, tm.Metadata.Namespace, tm.Metadata.Name)
	if coreGroups[tm.APIVersion] {
		return "skip " + id, nil
	}
	newObj, ok := known[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return id, errors.New("no API type known for this custom resource")
	}
	// UnmarshalStrict: YAML -> JSON, then a JSON decoder with DisallowUnknownFields, and
	// duplicate keys are errors.
	if err := yaml.UnmarshalStrict(doc, newObj()); err != nil {
		return id, err
	}
	return "ok " + id, nil
}

func run(r io.Reader) (int, int) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	checked, failed := 0, 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return checked, failed
		}
		if err != nil {
			fmt.Printf("FAIL reading the stream: %v\n", err)
			return checked, failed + 1
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		line, err := check(doc)
		if err != nil {
			failed++
			fmt.Printf("FAIL %s: %v\n", line, err)
			continue
		}
		checked++
		fmt.Println(line)
	}
}

func main() {
	checked, failed := 0, 0
	if len(os.Args) == 1 {
		checked, failed = run(os.Stdin)
	}
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Printf("FAIL %v\n", err)
			failed++
			continue
		}
		c, fl := run(f)
		f.Close()
		checked, failed = checked+c, failed+fl
	}
	fmt.Printf("crdcheck: %d objects ok, %d failed\n", checked, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
