#!/bin/sh
# stub.sh: stands in for docker, kind, kubectl, helm, curl, openssl and go in kind_test.go. It appends
# its name and arguments to $STUB_LOG, the content of every *.yaml or *.env file it is given,
# creates the files curl and openssl would write, and prints what the scripts read back.
name=$(basename "$0")
printf '%s %s\n' "$name" "$*" >>"$STUB_LOG"
prev=""
for a in "$@"; do
  case "$a" in
    *.yaml | *.env) if [ -f "$a" ]; then sed 's/^/  | /' "$a" >>"$STUB_LOG"; fi ;;
  esac
  case "$name $prev" in
    "curl -o" | "openssl -keyout" | "openssl -out") echo stub >"$a" ;;
  esac
  if [ "$name $prev" = "kind --name" ] && [ "$1 $2" = "get nodes" ]; then echo "$a-control-plane"; fi
  prev=$a
done
case "$name $*" in
  "kind get kubeconfig"*) echo "apiVersion: v1" ;;
  "docker info"*) echo x86_64 ;;
  "docker inspect"*) echo 172.18.0.9 ;;
  "docker image inspect"*) exit 1 ;;
  "kubectl "*"--dry-run=client"*) echo "kind: Stub" ;;
  "kubectl "*"-f -"*) cat >/dev/null ;;
esac
exit 0
