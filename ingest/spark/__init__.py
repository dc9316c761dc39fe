"""Spark as the engine starts and uses it: the session, its JVM and jars, and reads by key.

:mod:`.session` builds the SparkSession (workers on this interpreter, the topic-log source
registered); :mod:`.java`, :mod:`.jars` and :mod:`.ivy` find the Java and resolve the connectors;
:mod:`.class_archive` makes the driver JVM start faster (:mod:`.archive_dump` writes it);
:mod:`.reads` reads a Delta table's rows by key on the executors; :mod:`.sql` quotes Spark SQL.
"""
