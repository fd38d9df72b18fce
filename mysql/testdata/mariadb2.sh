#!/bin/sh
# A second MariaDB server for the switch tests (mysql/switch_test.go,
# fanout/mysql_switch_test.go), started as .ci/run starts the first one:
# a data dir of its own, the mysql user when run as root, a free port of
# 127.0.0.1, and the binlog a follower and a replica need.
#
#   mariadb2.sh start DIR SERVER_ID   prints the port; exit 77 without mariadbd
#   mariadb2.sh stop DIR              stops it and removes DIR
set -eu
PATH=$PATH:/usr/sbin
cmd=$1 dir=$2
case $cmd in
start)
	id=$3
	command -v mariadbd >/dev/null 2>&1 || { echo "mariadbd not found" >&2; exit 77; }
	as=""
	if [ "$(id -u)" = 0 ]; then
		id mysql >/dev/null 2>&1 || { echo "no mysql user" >&2; exit 77; }
		chown mysql "$dir"
		as="runuser -u mysql --"
	fi
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		awk 'BEGIN { srand(); print 40000 + int(rand() * 10000) }')
	$as mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal >"$dir/install.log" 2>&1 ||
		{ cat "$dir/install.log" >&2; exit 1; }
	$as mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/sock" --pid-file="$dir/pid" \
		--bind-address=127.0.0.1 --port="$port" --skip-name-resolve \
		--log-bin=binlog --binlog-format=ROW --binlog-row-metadata=FULL --log-slave-updates --gtid-strict-mode=ON \
		--server-id="$id" --innodb-flush-log-at-trx-commit=2 \
		--character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci --max-connections=200 \
		>>"$dir/server.log" 2>&1 </dev/null &
	for _ in $(seq 300); do
		if mariadb -S "$dir/sock" -uroot -e 'SELECT 1' >/dev/null 2>&1; then
			echo "$port"
			exit 0
		fi
		sleep 0.1
	done
	cat "$dir/server.log" >&2
	exit 1
	;;
stop)
	if [ -s "$dir/pid" ]; then
		pid=$(cat "$dir/pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
	;;
*)
	echo "usage: $0 start DIR SERVER_ID | stop DIR" >&2
	exit 2
	;;
esac
