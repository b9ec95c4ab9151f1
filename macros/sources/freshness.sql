{#-- `dbt source freshness` without a loaded_at_field, from the sources' commit times.

  dbt calls get_relation_last_modified for the sources whose freshness has neither
  loaded_at_field nor loaded_at_query (the adapter declares TableLastModifiedMetadata). The
  engine reads each source: the commit time of its newest Delta version (the table at its
  meta.consistent_stream location, else the Delta table its name finds in the catalog), or of
  the newest transaction captured into its CDC landing directory. A catalog table that is not
  a Delta table is an error naming it: give it a loaded_at_field. --#}

{% macro consistent_spark__get_relation_last_modified(information_schema, relations) -%}
  {%- set wanted = {} -%}
  {%- for relation in relations -%}
    {%- do wanted.update({(relation.schema | lower) ~ '.' ~ (relation.identifier | lower): relation}) -%}
  {%- endfor -%}
  {%- set sources = [] -%}
  {%- set names = [] -%}
  {%- set found = [] -%}
  {%- for node in graph.sources.values() -%}
    {%- set key = (node.schema | lower) ~ '.' ~ (node.identifier | lower) -%}
    {%- if key in wanted and key not in found -%}
      {%- set stream_meta = consistent_stream_source_meta(node) -%}
      {%- do found.append(key) -%}
      {%- do sources.append(consistent_stream_source_dict(node, stream_meta)) -%}
      {%- do names.append([wanted[key].schema, wanted[key].identifier]) -%}
    {%- endif -%}
  {%- endfor -%}
  {{ return(adapter.consistent_stream_last_modified(sources, names)) }}
{%- endmacro %}
