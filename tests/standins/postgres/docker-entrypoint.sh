#!/usr/bin/env bash
# Stand-in for the entrypoint of the official postgres image (docker-library/postgres), the
# part of it docker-compose.yml relies on:
#
#   postgres ARGS...  (or ARGS starting with "-")
#       run as root: give PGDATA and the socket folder to postgres, then run again as
#       postgres. With an empty PGDATA: initdb (superuser POSTGRES_USER with
#       POSTGRES_PASSWORD; POSTGRES_INITDB_ARGS added), append
#       `host all all all $POSTGRES_HOST_AUTH_METHOD` (default scram-sha-256) to pg_hba.conf,
#       create POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sh (executed when executable,
#       else sourced) and *.sql (psql) against a temporary server on the unix socket only,
#       stop it. Then exec postgres ARGS.
#   anything else     exec'd as given.
#
# Environment, as upstream: POSTGRES_PASSWORD (required for a new PGDATA), POSTGRES_USER
# (postgres), POSTGRES_DB (POSTGRES_USER), POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD,
# PGDATA, PGPORT (the server's and the tools' default port).
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
  exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chmod 0700 "$PGDATA"
  find "$PGDATA" /var/run/postgresql \! -user postgres -exec chown postgres:postgres '{}' +
  chmod 3777 /var/run/postgresql
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
export POSTGRES_USER POSTGRES_DB

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
    echo "Error: Database is uninitialized and superuser password is not specified." >&2
    echo "       You must specify POSTGRES_PASSWORD to a non-empty value for the superuser." >&2
    exit 1
  fi
  read -ra initdb_args <<<"${POSTGRES_INITDB_ARGS:-}"
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    "${initdb_args[@]}"
  printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p ${PGPORT:-5432}" -w start
  export PGPASSWORD="${PGPASSWORD:-${POSTGRES_PASSWORD:-}}"
  psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
  if [ "$POSTGRES_DB" != postgres ]; then
    "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh)
        if [ -x "$f" ]; then
          echo "$0: running $f"
          "$f"
        else
          echo "$0: sourcing $f"
          # shellcheck disable=SC1090
          . "$f"
        fi
        ;;
      *.sql)
        echo "$0: running $f"
        "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f"
        ;;
      *) [ ! -e "$f" ] || echo "$0: ignoring $f" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  unset PGPASSWORD
  echo
  echo 'PostgreSQL init process complete; ready for start up.'
  echo
fi

exec "$@"
