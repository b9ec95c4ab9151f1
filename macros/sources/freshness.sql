{#-- `dbt source freshness` without a loaded_at_field, from the sources' commit times.

  dbt calls get_relation_last_modified for the sources whose freshness has neither
  loaded_at_field nor loaded_at_query (the adapter declares TableLastModifiedMetadata). A
  source with meta.consistent_stream is read by the engine: the commit time of its newest
  Delta version, or of the newest transaction captured into its CDC landing directory. A
  source without it is an error naming it (Spark's catalog keeps no modification time): give
  it a loaded_at_field. --#}

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
      {%- if not stream_meta -%}
        {%- do exceptions.raise_compiler_error(
            "Source '" ~ node.source_name ~ "." ~ node.name ~ "' has a freshness check but no loaded_at_field and no "
            ~ "meta.consistent_stream: its last modification time is known only for a source the engine reads "
            ~ "(meta.consistent_stream with format and location). Give it a loaded_at_field, or declare its "
            ~ "meta.consistent_stream") -%}
      {%- endif -%}
      {%- do found.append(key) -%}
      {%- do sources.append(consistent_stream_source_dict(node, stream_meta)) -%}
      {%- do names.append([wanted[key].schema, wanted[key].identifier]) -%}
    {%- endif -%}
  {%- endfor -%}
  {{ return(adapter.consistent_stream_last_modified(sources, names)) }}
{%- endmacro %}
