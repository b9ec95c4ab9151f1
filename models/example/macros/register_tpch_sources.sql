{% macro register_tpch_sources(source_name='tpch') %}
  {#-- The example's stand-in for a lakehouse team's ingestion, run by on-run-start: each table
       of the source `source_name` in sources.yml is registered in the session's catalog as an
       external Delta table, `<schema>.<table>` at `$TPCH_DIR/<table>` (where
       `consistent-stream-testing tpch-generate` wrote it), so sources.yml names the tables by
       their catalog names as a project's sources do, with no location. A table registered at
       another location (a TPCH_DIR of an earlier run) is re-pointed; dropping an external
       table's entry leaves its files alone. A relative TPCH_DIR is taken from the Spark
       driver's working directory, as Spark takes a relative LOCATION. Three statements when
       nothing changed. --#}
  {%- if execute -%}
    {%- set tables = graph.sources.values() | selectattr('source_name', 'equalto', source_name) | list -%}
    {%- if tables -%}
      {%- set schema = tables[0].schema -%}
      {%- set root = env_var('TPCH_DIR', 'data/tpch').rstrip('/') -%}
      {%- if not (root.startswith('/') or '://' in root) -%}
        {%- set cwd = run_query("select reflect('java.lang.System', 'getProperty', 'user.dir')").columns[0].values()[0] -%}
        {%- set root = cwd.rstrip('/') ~ '/' ~ root -%}
      {%- endif -%}
      {%- do run_query('create schema if not exists ' ~ schema) -%}
      {%- set registered = {} -%}
      {%- set listed = run_query("show table extended in " ~ schema ~ " like '"
                                  ~ (tables | map(attribute='identifier') | join('|')) ~ "'") -%}
      {%- for row in listed -%}
        {%- for line in row['information'].split('\n') if line.startswith('Location: ') -%}
          {%- do registered.update({row['tableName']: line[10:].strip()}) -%}
        {%- endfor -%}
      {%- endfor -%}
      {%- for node in tables -%}
        {%- set location = root ~ '/' ~ node.identifier -%}
        {%- set found = registered.get(node.identifier) -%}
        {%- set plain = found.replace('file:///', '/').replace('file:/', '/').rstrip('/') if found else none -%}
        {%- if found is not none and plain != location -%}
          {%- do log('tpch source ' ~ schema ~ '.' ~ node.identifier ~ ' was registered at ' ~ found
                     ~ ': re-pointed to ' ~ location, info=true) -%}
          {%- do run_query('drop table ' ~ schema ~ '.' ~ node.identifier) -%}
        {%- endif -%}
        {%- if found is none or plain != location -%}
          {%- do run_query('create table ' ~ schema ~ '.' ~ node.identifier ~ " using delta location '"
                           ~ location ~ "'") -%}
        {%- endif -%}
      {%- endfor -%}
    {%- endif -%}
  {%- endif -%}
{% endmacro %}
