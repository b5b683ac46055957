"""Local development environment: a real Kubernetes control plane (etcd + kube-apiserver + controller-manager)."""
