// Command images builds aether's container images without a Docker engine (spike version).
package main

import (
	"flag"
	"log"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aethermesh/aether/images"
)

func main() {
	out := flag.String("out", ".", "directory for the image tarballs")
	bin := flag.String("bin", ".", "directory of static binaries")
	flag.Parse()
	for _, n := range []string{"pause", "echo"} {
		img, err := images.BuildImage([]images.Layer{{Files: []images.File{{Src: filepath.Join(*bin, n), Dst: "/" + n}}}},
			images.Config{Entrypoint: []string{"/" + n}})
		if err != nil {
			log.Fatal(err)
		}
		tag, _ := name.NewTag("registry.aether.test/" + n + ":dev")
		if err := tarball.WriteToFile(filepath.Join(*out, n+".tar"), tag, img); err != nil {
			log.Fatal(err)
		}
	}
}
