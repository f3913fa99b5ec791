#!/bin/sh
# Runs once, when the postgres volume is empty (the postgres image runs the files of
# /docker-entrypoint-initdb.d against a server that listens on its unix socket only).
#
# Two roles and two databases, each role owning one database and unable to connect to the
# other: `hub` (JupyterHub's state, database `jupyterhub`) and `credits` (the reference credits
# service's ledger, database `credits`). Their passwords come from GPUHUB_DB_PASSWORD and
# GPUHUB_CREDITS_DB_PASSWORD (see .env); they travel through psql variables read with
# \getenv, never on a command line, and this session neither logs its statements nor a
# failing one (which would show a password in the server log).
set -eu
: "${GPUHUB_DB_PASSWORD:?is empty: run gpuhub init (docs/tutorial/first-hub.md)}"
: "${GPUHUB_CREDITS_DB_PASSWORD:?is empty: run gpuhub init (docs/tutorial/first-hub.md)}"

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --no-password --no-psqlrc \
  --dbname postgres <<'SQL'
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
\getenv hub_password GPUHUB_DB_PASSWORD
\getenv credits_password GPUHUB_CREDITS_DB_PASSWORD
CREATE ROLE hub LOGIN PASSWORD :'hub_password';
CREATE ROLE credits LOGIN PASSWORD :'credits_password';
CREATE DATABASE jupyterhub OWNER hub;
CREATE DATABASE credits OWNER credits;
REVOKE ALL ON DATABASE jupyterhub FROM PUBLIC;
REVOKE ALL ON DATABASE credits FROM PUBLIC;
SQL
echo "gpuhub: made the roles hub and credits and their databases jupyterhub and credits"
