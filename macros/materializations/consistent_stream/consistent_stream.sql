{#--
  An incrementally maintained, strongly consistent materialized view in a Delta table.
  Jinja only validates the config and collects the sources; the engine
  (consistent_stream.job.run_model, reached through adapter.consistent_stream_run) does the
  rest, including registering the target as {{ this }} in the catalog after each commit.
--#}
{% materialization consistent_stream, adapter='consistent_spark', supported_languages=['sql'] -%}

  {#-- Validate early, before anything runs --#}
  {%- set unique_key = consistent_stream_validate_unique_key(config.get('unique_key', none)) -%}
  {%- set partition_by = consistent_stream_validate_partition_by(config.get('partition_by', none)) -%}
  {%- do consistent_stream_validate_file_format(config.get('file_format', none)) -%}
  {%- set sources = consistent_stream_model_sources(model) -%}
  {%- set contract = consistent_stream_contract(model) -%}
  {%- do consistent_stream_warn_grants(config.get('grants', none)) -%}

  {%- set target_relation = this.incorporate(type='table') -%}
  {%- set full_refresh = should_full_refresh() -%}
  {#-- Every key of the engine's model config (consistent_stream.model_config) that the model sets
       in config(), the validated ones as validated; contract, constraints and docs come from dbt's
       contract and persist_docs --#}
  {%- set stream_config = {} -%}
  {%- for key in adapter.consistent_stream_config_keys() -%}
    {%- do stream_config.update({key: config.get(key, none)}) -%}
  {%- endfor -%}
  {%- do stream_config.update({
      'unique_key': unique_key,
      'partition_by': partition_by,
      'contract': contract.columns,
      'constraints': contract.constraints,
      'docs': consistent_stream_docs(model),
  }) -%}

  {{ run_hooks(pre_hooks) }}

  {%- if flags.EMPTY -%}
    {#-- dbt's schema-only dry run (`--empty`: every ref() and source() a `where false limit 0`
         subquery): a new target is an empty, typed Delta table and no checkpoint, which the next
         real run replaces with a build; an existing one is kept as it is --#}
    {%- if load_cached_relation(this) is none -%}
      {% call statement('main') -%}
        create table {{ target_relation }} using delta as {{ compiled_code }}
      {%- endcall %}
      {% do log('consistent_stream ' ~ model['name'] ~ ': --empty, built an empty table of the model\'s columns; '
                 ~ 'the next run builds the view', info=True) %}
    {%- else -%}
      {% do log('consistent_stream ' ~ model['name'] ~ ': --empty, the existing target is kept as it is', info=True) %}
      {% do store_raw_result(name='main', message='kept (--empty)', code='OK', rows_affected=0) %}
    {%- endif -%}
    {{ run_hooks(post_hooks) }}
    {{ return({'relations': [target_relation]}) }}
  {%- endif -%}

  {%- set summary = adapter.consistent_stream_run(
      compiled_code, sources, stream_config,
      target_relation.schema, target_relation.identifier, model['name'], full_refresh) -%}

  {%- set change = summary.get('configuration_change') -%}
  {%- if change and change.get('action') == 'continue' -%}
    {% do exceptions.warn('Configuration changes were identified and `on_configuration_change` was set to `continue` for `'
                          ~ target_relation.render() ~ '`: the view is kept as it is, at version '
                          ~ summary.get('target_version') ~ ', and not refreshed. Changes:\n  - '
                          ~ change.get('changes') | join('\n  - ')) %}
  {%- endif -%}
  {%- if full_refresh or (change and change.get('action') == 'apply') -%}
    {#-- dbt's words for a materialized view that is rebuilt (every change of a consistent_stream model is) --#}
    {% do log('Applying REPLACE to: ' ~ target_relation) %}
  {%- endif -%}
  {%- if change and change.get('action') == 'apply' -%}
    {% do log('consistent_stream ' ~ model['name'] ~ ': configuration changes were identified; rebuilt the view '
              ~ '(a full refresh, on_configuration_change ' ~ config.get('on_configuration_change') ~ '). Changes:\n  - '
              ~ change.get('changes') | join('\n  - '), info=True) %}
  {%- endif -%}
  {%- if summary.get('up_to_date') -%}
    {% do log('consistent_stream ' ~ summary.get('model', model['name']) ~ ': up to date, target version '
               ~ summary.get('target_version') ~ ', freshness ' ~ summary.get('freshness_s') ~ ' s, '
               ~ ((summary.get('seconds') or 0) | round(2)) ~ ' s', info=True) %}
  {%- else -%}
    {% do log('consistent_stream ' ~ summary.get('model', model['name']) ~ ': '
               ~ summary.get('batches') ~ ' batches, '
               ~ summary.get('changes_read') ~ ' changes read, '
               ~ summary.get('rows_written') ~ ' rows written in '
               ~ ((summary.get('seconds') or 0) | round(2)) ~ ' s, target version '
               ~ summary.get('target_version') ~ ', freshness '
               ~ summary.get('freshness_s') ~ ' s', info=True) %}
  {%- endif %}
  {% for batch in summary.get('metrics', []) %}
    {% do log('consistent_stream ' ~ model['name'] ~ ' batch ' ~ batch.get('batch_id') ~ ' ('
               ~ batch.get('strategy') ~ (': ' ~ batch.get('reason') if batch.get('reason') else '') ~ '): '
               ~ batch.get('seconds') ~ ' s, '
               ~ (batch.get('spark_jobs') ~ ' Spark jobs, ' if batch.get('spark_jobs') is not none else '')
               ~ batch.get('changes_read') ~ ' changes read, ' ~ batch.get('state_rows_read') ~ ' state rows read, '
               ~ batch.get('target_rows_rewritten') ~ ' target rows rewritten, '
               ~ (batch.get('changes_on_executors') ~ ' changes too large for the driver written by the executors, '
                  if batch.get('changes_on_executors') else '')
               ~ 'phases ' ~ tojson(batch.get('phases')), info=True) %}
  {% endfor %}
  {% for progress in summary.get('progress', []) %}
    {% do log('consistent_stream ' ~ model['name'] ~ ' StreamingQueryProgress ' ~ tojson(progress), info=False) %}
  {% endfor %}
  {% do store_raw_result(name='main', message=('up to date, version ' if summary.get('up_to_date')
                                             else 'kept (configuration changed), version ' if change and change.get('action') == 'continue'
                                             else 'OK version ') ~ summary.get('target_version'),
                         code='OK', rows_affected=summary.get('rows_written')) %}

  {{ run_hooks(post_hooks) }}

  {{ return({'relations': [target_relation]}) }}

{%- endmaterialization %}
