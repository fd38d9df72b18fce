// Package mysql keeps every process's guard in step with a MySQL or
// MariaDB table, from the server's row-based binary log.
package mysql
