// Stand-in for contrib's pkg/semconvtest, a test-only helper that k8sattributesprocessor's
// own tests import. `go mod tidy` (run by the builder) resolves test imports of dependencies,
// but v0.161.0 of that module is not served by the module proxy. Nothing in the collector
// binary imports it, so an empty package satisfies tidy and nothing is compiled from it.
module github.com/open-telemetry/opentelemetry-collector-contrib/pkg/semconvtest

go 1.25
