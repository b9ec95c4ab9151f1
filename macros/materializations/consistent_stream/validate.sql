{#-- Config validation and source collection for the consistent_stream materialization. --#}

{% macro consistent_stream_is_string_list(value) -%}
  {#-- true when value is a non-empty list of non-empty strings --#}
  {%- do return(value is iterable and value is not string and value is not mapping
                and value | length > 0
                and value | select('string') | map('trim') | select | list | length == value | length) -%}
{%- endmacro %}


{% macro consistent_stream_validate_unique_key(unique_key) %}
  {%- if unique_key is none -%}
    {%- do return(none) -%}
  {%- elif unique_key is string and unique_key | trim -%}
    {%- do return(unique_key) -%}
  {%- elif consistent_stream_is_string_list(unique_key) -%}
    {%- do return(unique_key | list) -%}
  {%- endif -%}
  {%- set msg -%}
Invalid config `unique_key` for consistent_stream model {{ model.name }}: {{ unique_key | tojson }}.
`unique_key` is the column (a string) or columns (a list of strings) that identify a row of the
model's result, e.g. unique_key='l_orderkey' or unique_key=['l_returnflag', 'l_linestatus'],
in config() or in the model's YAML config. Leave it unset to use the key inferred from the SQL
(GROUP BY keys, source primary keys through joins); a result without one is kept as a bag.
  {%- endset -%}
  {%- do exceptions.raise_compiler_error(msg) -%}
{% endmacro %}


{% macro consistent_stream_validate_partition_by(partition_by) %}
  {%- if partition_by is none or (partition_by is string and partition_by | trim) -%}
    {%- do return(partition_by) -%}
  {%- elif consistent_stream_is_string_list(partition_by) -%}
    {%- do return(partition_by | list) -%}
  {%- endif -%}
  {%- set msg -%}
Invalid config `partition_by` for consistent_stream model {{ model.name }}: {{ partition_by | tojson }}.
Expected a column name (a string) or a list of column names, or leave it unset.
  {%- endset -%}
  {%- do exceptions.raise_compiler_error(msg) -%}
{% endmacro %}


{% macro consistent_stream_validate_file_format(file_format) %}
  {%- if file_format is not none and file_format != 'delta' -%}
    {%- set msg -%}
Invalid config `file_format` for consistent_stream model {{ model.name }}: {{ file_format | tojson }}.
A consistent_stream target is a Delta table: set file_format='delta' or leave it unset.
    {%- endset -%}
    {%- do exceptions.raise_compiler_error(msg) -%}
  {%- endif -%}
{% endmacro %}


{% macro consistent_stream_model_sources(model) %}
  {#-- One {source_name, name, relation, meta} per dbt source the model reads: relation is
       source(a, b) exactly as it renders in the compiled SQL, meta the table's
       meta.consistent_stream. --#}
  {%- set sources = [] -%}
  {%- set seen = [] -%}
  {%- for source_name, table_name in model.sources if (source_name ~ '.' ~ table_name) not in seen -%}
    {%- do seen.append(source_name ~ '.' ~ table_name) -%}
    {%- set node = graph.sources.values() | selectattr('source_name', 'equalto', source_name)
                                          | selectattr('name', 'equalto', table_name) | first -%}
    {%- set config_meta = node.config.meta if node.config is defined and node.config.meta else {} -%}
    {%- set stream_meta = node.meta.get('consistent_stream') or config_meta.get('consistent_stream') -%}
    {%- if not stream_meta -%}
      {%- set msg -%}
Source '{{ source_name }}.{{ table_name }}' (read by consistent_stream model {{ model.name }}) has no
`meta.consistent_stream`. Say how to read it as a changelog in its YAML, under the table, e.g.
  - name: {{ table_name }}
    meta:
      consistent_stream:
        format: delta
        location: data/{{ table_name }}
        primary_key: [...]
      {%- endset -%}
      {%- do exceptions.raise_compiler_error(msg) -%}
    {%- endif -%}
    {%- do sources.append({
        'source_name': source_name,
        'name': table_name,
        'relation': source(source_name, table_name) | string,
        'meta': stream_meta,
    }) -%}
  {%- endfor -%}
  {%- do return(sources) -%}
{% endmacro %}
