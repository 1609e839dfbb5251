#!/bin/sh
# The aether-spire-agent image's entrypoint: spire-agent with its arguments, under umask 077.
#
# spire-agent creates the directory of its admin socket (admin_socket_path, where the Delegated
# Identity API is served to the authorized delegates) when it is missing, mode 0755 less the
# umask, and makes the socket itself 0777. With umask 077 the directory is 0700, owned by root:
# only root on the node (the aether agent) reaches the socket. The chart mounts the node's
# /run/spire so that spire-agent creates /run/spire/agent-admin itself; the Workload API's
# directory is a mount of its own, made 0755 by the kubelet, for the workloads that use it.
umask 077
exec /usr/local/bin/spire-agent "$@"
