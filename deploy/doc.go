// Package deploy holds no code: it is the home of kvrouterd's container image (Dockerfile and
// build.sh), its Kubernetes manifests (kubernetes/, a kustomize base, and
// kubernetes/auth, a component adding bearer tokens) and its Grafana dashboard
// (grafana/), and of the tests that keep them true to the daemon they ship. The tests build
// the binary with build.sh, the script the Dockerfile runs, and check it is static; parse the
// Dockerfile, every manifest and the dashboard; and check each flag, port, probe path and
// metric they name against the flag parser, the defaults and a daemon started in process.
// docs/deployment.md is the guide.
package deploy
