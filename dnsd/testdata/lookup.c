/* lookup: resolve one name with the C library's getaddrinfo (AF_UNSPEC, like curl) and print
 * the canonical name and every address, one per line. The dnsd tests build it with musl-gcc
 * -static to check musl's resolver against the agent's DNS. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int main(int argc, char **argv) {
	struct addrinfo hints, *res, *p;
	char buf[INET6_ADDRSTRLEN];
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: lookup NAME\n");
		return 2;
	}
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_CANONNAME;
	rc = getaddrinfo(argv[1], NULL, &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "getaddrinfo %s: %s\n", argv[1], gai_strerror(rc));
		return 1;
	}
	if (res->ai_canonname)
		printf("canonical %s\n", res->ai_canonname);
	for (p = res; p; p = p->ai_next) {
		void *a = p->ai_family == AF_INET ? (void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr
		                                  : (void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
		if (inet_ntop(p->ai_family, a, buf, sizeof buf))
			printf("%s\n", buf);
	}
	freeaddrinfo(res);
	return 0;
}
